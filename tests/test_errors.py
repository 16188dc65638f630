"""Every user error is one clear `webiree` error with a hint, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import webiree
from webiree.cli import main
from webiree.testing import models
from webiree.testing.models import make_model


def cli(capsys, *args):
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def test_missing_file(capsys, tmp_path):
    rc, _, err = cli(capsys, "build", str(tmp_path / "nope.onnx"), "--out", str(tmp_path / "o"))
    assert rc == 2
    assert "webiree: error: no such file" in err and "hint:" in err and "Traceback" not in err


def test_not_onnx(capsys, tmp_path):
    p = tmp_path / "junk.onnx"
    p.write_bytes(b"\x00\x01 definitely not a protobuf \xff" * 10)
    rc, _, err = cli(capsys, "build", str(p), "--out", str(tmp_path / "o"))
    assert rc == 2 and "is not an ONNX model" in err


def test_truncated_model(capsys, tmp_path):
    p = tmp_path / "cut.onnx"
    p.write_bytes(models.small_cnn().SerializeToString()[:500])
    rc, _, err = cli(capsys, "build", str(p), "--out", str(tmp_path / "o"))
    assert rc == 2 and "webiree: error:" in err and "Traceback" not in err


def test_unsupported_ops_listed_in_one_message(tmp_path):
    vi = helper.make_tensor_value_info
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="ok"),
             helper.make_node("StringNormalizer", ["s"], ["t"], name="strnorm"),
             helper.make_node("Det", ["a"], ["d"], name="det1"),
             helper.make_node("Det", ["a"], ["e"], name="det2"),
             helper.make_node("Add", ["d", "e"], ["y"], name="add")]
    # (Det is supported up to 4x4 matrices)
    m = make_model(nodes, [vi("x", TensorProto.FLOAT, [2, 5, 5]), vi("s", TensorProto.STRING, [2])],
                   [vi("y", TensorProto.FLOAT, [2]), vi("t", TensorProto.STRING, None)], {})
    with pytest.raises(webiree.UnsupportedOpError) as e:
        webiree.compile(m, tmp_path)
    msg = str(e.value)
    assert "det1" in msg and "det2" in msg and "Det" in msg
    assert "3 node(s)" in msg or "StringNormalizer" in msg


def test_symbolic_input_needs_input_shape(capsys, tmp_path):
    vi = helper.make_tensor_value_info
    m = make_model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", TensorProto.FLOAT, ["batch", 8])],
                   [vi("y", TensorProto.FLOAT, ["batch", 8])], {})
    p = tmp_path / "sym.onnx"
    onnx.save(m, p)
    rc, _, err = cli(capsys, "build", str(p), "--out", str(tmp_path / "o"))
    assert rc == 2
    assert "symbolic dim(s) ['batch'] have no bound" in err and "--dim batch=1..N" in err and "--input-shape x=1,8" in err
    rc, out, err = cli(capsys, "build", str(p), "--out", str(tmp_path / "o"), "--input-shape", "x=3,8")
    assert rc == 0, err
    sess = webiree.InferenceSession(tmp_path / "o")
    assert sess.get_inputs()[0].shape == [3, 8]


def test_bad_input_shape_flag(capsys, tmp_path):
    p = tmp_path / "m.onnx"
    onnx.save(models.mlp(), p)
    rc, _, err = cli(capsys, "build", str(p), "--out", str(tmp_path / "o"), "--input-shape", "nosuch=1,2")
    assert rc == 2 and "names no input" in err and "'x'" in err
    rc, _, err = cli(capsys, "build", str(p), "--out", str(tmp_path / "o"), "--input-shape", "x=1,2,3")
    assert rc == 2 and "gives 3 dims" in err


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("mlp")
    webiree.compile(models.mlp(), d)
    return d


def test_wrong_feed_name(built):
    sess = webiree.InferenceSession(built)
    with pytest.raises(webiree.FeedError, match="unknown input name.*'y'.*") as e:
        sess.run(None, {"y": np.zeros((4, 64), np.float32)})
    assert "'x'" in e.value.hint


def test_wrong_feed_shape(built):
    sess = webiree.InferenceSession(built)
    with pytest.raises(webiree.FeedError, match=r"shape \(4, 63\).*compiled for \(4, 64\)"):
        sess.run(None, {"x": np.zeros((4, 63), np.float32)})


def test_wrong_feed_dtype(built):
    sess = webiree.InferenceSession(built)
    with pytest.raises(webiree.FeedError, match="must be float32, got float64"):
        sess.run(None, {"x": np.zeros((4, 64), np.float64)})


def test_missing_feed_and_bad_output_name(built):
    sess = webiree.InferenceSession(built)
    with pytest.raises(webiree.FeedError, match="missing input"):
        sess.run(None, {})
    with pytest.raises(webiree.FeedError, match="unknown output"):
        sess.run(["nope"], {"x": np.zeros((4, 64), np.float32)})


def test_int64_out_of_int32_range(tmp_path):
    vi = helper.make_tensor_value_info
    m = make_model([helper.make_node("Gather", ["table", "ids"], ["y"])], [vi("ids", TensorProto.INT64, [3])],
                   [vi("y", TensorProto.FLOAT, [3, 4])], {"table": np.arange(40, dtype=np.float32).reshape(10, 4)})
    webiree.compile(m, tmp_path)
    sess = webiree.InferenceSession(tmp_path)
    np.testing.assert_array_equal(sess.run(None, {"ids": np.array([1, -1, 9])})[0],
                                  np.arange(40, dtype=np.float32).reshape(10, 4)[[1, -1, 9]])
    with pytest.raises(webiree.FeedError, match="outside the int32 range"):
        sess.run(None, {"ids": np.array([1, 2, 1 << 40])})


def test_run_cli_on_missing_build(capsys, tmp_path):
    rc, _, err = cli(capsys, "run", str(tmp_path))
    assert rc == 2 and "no webiree build" in err


def test_run_cli_feed_error_message(capsys, built, tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((2, 2), np.float32))
    rc, _, err = cli(capsys, "run", str(built), "--input", f"x={tmp_path / 'x.npy'}")
    assert rc == 2 and "shape (2, 2)" in err and "Traceback" not in err


def test_no_webgpu_adapter(built):
    env = dict(os.environ, WGPU_BACKEND_TYPE="Vulkan", VK_ICD_FILENAMES="/nonexistent.json",
               VK_DRIVER_FILES="/nonexistent.json")
    p = subprocess.run([sys.executable, "-m", "webiree.cli", "run", str(built), "--random"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert "no WebGPU adapter" in p.stderr and "mesa-vulkan-drivers" in p.stderr
    assert "Traceback" not in p.stderr


def test_debug_flag_shows_traceback(tmp_path):
    p = subprocess.run([sys.executable, "-m", "webiree.cli", "--debug", "build", str(tmp_path / "x.onnx"),
                        "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "Traceback" in p.stderr


def test_cli_build_run_inspect(capsys, tmp_path):
    p = tmp_path / "cnn.onnx"
    onnx.save(models.small_cnn(), p)
    rc, out, err = cli(capsys, "build", str(p), "--out", str(tmp_path / "site"))
    assert rc == 0, err
    assert "9 dispatches" in out
    x = models.sample_inputs(models.small_cnn())["image"]
    np.save(tmp_path / "img.npy", x)
    rc, out, err = cli(capsys, "run", str(tmp_path / "site"), "--input", f"image={tmp_path / 'img.npy'}",
                       "--output-dir", str(tmp_path / "res"))
    assert rc == 0, err
    assert "probs: shape [1, 10] float32" in out
    from .conftest import assert_close, ort_run
    assert_close(np.load(tmp_path / "res" / "probs.npy"), ort_run(models.small_cnn(), {"image": x})[0])
    rc, out, err = cli(capsys, "inspect", str(tmp_path / "site"))
    assert rc == 0 and "dispatches: 9" in out


@pytest.mark.parametrize("unbuffered", ["1", ""])
def test_inspect_into_a_closed_pipe(built, unbuffered):
    """`webiree inspect DIR | head -1`: the reader gone before we write is no error of ours (exit 0,
    nothing on stderr: no 'internal error', no 'Exception ignored' at the final flush), whether
    stdout is unbuffered or block-buffered (then the write happens at the flush)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if unbuffered:
        env["PYTHONUNBUFFERED"] = unbuffered
    p = subprocess.Popen([sys.executable, "-m", "webiree.cli", "inspect", str(built)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p.stdout.close()        # the reader leaves before the first line is written
    err = p.stderr.read()
    assert p.wait(timeout=120) == 0, err
    assert err == ""
