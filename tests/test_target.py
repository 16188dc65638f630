"""The Target (webiree/target.py): presets, limits dicts and adapters give the planner's limits."""

from __future__ import annotations

import pytest

import webiree
from webiree.target import DEFAULT_LIMITS, Target


def test_presets():
    assert Target.preset("default").as_limits() == DEFAULT_LIMITS
    assert Target.preset("cpu").as_limits() == {**DEFAULT_LIMITS, "device_class": "cpu"}
    assert Target.preset("gpu").as_limits() == {**DEFAULT_LIMITS, "device_class": "gpu"}
    with pytest.raises(webiree.LimitsError, match="no target preset 'tpu'"):
        Target.preset("tpu")


def test_from_limits_and_adapter():
    t = Target.from_limits({"max_buffer_size": 1 << 40, "device_class": "cpu", "subgroup_size": 8})
    assert t.as_limits()["max_buffer_size"] == 0xFFFFFFFF      # the module records u32
    assert (t.device_class, t.subgroup_size) == ("cpu", 8)
    a = Target.from_adapter({**DEFAULT_LIMITS, "max_compute_workgroup_storage_size": 32768, "vendor_thing": 1},
                            "CPU", 8, features=["shader_f16"])
    assert a.as_limits() == {**DEFAULT_LIMITS, "max_compute_workgroup_storage_size": 32768, "device_class": "cpu",
                             "subgroup_size": 8, "shader_f16": True}
    assert Target.from_adapter(DEFAULT_LIMITS, "DiscreteGPU").device_class == "gpu"
    with pytest.raises(webiree.LimitsError, match="must be a positive integer"):
        Target.from_limits({"max_buffer_size": 0})
    with pytest.raises(webiree.LimitsError, match="device_class"):
        Target.from_limits({"device_class": "npu"})


def test_a_preset_builds_like_its_dict(tmp_path):
    from webiree.testing import models

    a = webiree.compile(models.small_cnn(), tmp_path / "a", limits="cpu")
    b = webiree.compile(models.small_cnn(), tmp_path / "b", limits={"device_class": "cpu"})
    assert (tmp_path / "a" / "model.wrm").read_bytes() == (tmp_path / "b" / "model.wrm").read_bytes()
    c = webiree.compile(models.small_cnn(), tmp_path / "c", limits="default")
    strategies = lambda r: [d.config.strategy for d in r.dispatches]   # noqa: E731
    assert strategies(a) == strategies(b) != strategies(c)     # CPU-adapter kernels, not the default ones
