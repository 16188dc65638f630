"""The package layering of docs/architecture.md, checked on every import in webiree/
(those inside functions too): imports point down, and no files import each other in a circle.

    top           cli, bundler, session, onnx_backend, bench, tune, demo_model, testing, webiree/__init__
    compiler      may import wgsl_codegen, module, ir, errors, dtypes, target
    wgsl_codegen  may import ir, errors, dtypes, target
    runtime core  hal_webgpu, runtime_py: may import module, errors, version, dtypes (never the compiler);
                  runtime_py also text (the `webiree_runtime` API exposes the tokenizers)
                  text (tokenizers, pure Python): may import errors
    module        the schedule module's wire format, the build folder: errors, version, dtypes
    ground        ir (imports nothing of webiree), errors, version, dtypes, target (errors only)
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

TOP = None   # a package of the top layer may import any package
ALLOWED = {
    "ir": set(),
    "errors": set(),
    "version": set(),
    "dtypes": set(),
    "target": {"errors"},
    "module": {"errors", "version", "dtypes"},
    "wgsl_codegen": {"ir", "errors", "dtypes", "target"},
    "compiler": {"wgsl_codegen", "module", "ir", "errors", "dtypes", "target"},
    "hal_webgpu": {"module", "errors", "version", "dtypes"},
    "runtime_py": {"hal_webgpu", "module", "errors", "version", "dtypes", "text"},
    "text": {"errors"},
    **{name: TOP for name in ("cli", "bundler", "session", "onnx_backend", "bench", "tune", "demo_model", "testing",
                              "webiree")},
}


def import_edges(package_dir: Path) -> dict[str, set[str]]:
    """module name -> the modules of the same package it imports (every import statement)."""
    pkg_name = package_dir.name
    files = {}
    for p in package_dir.rglob("*.py"):
        parts = list(p.relative_to(package_dir.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        files[".".join(parts)] = (p, is_pkg)
    edges = {}
    for name, (path, is_pkg) in files.items():
        here = name.split(".") if is_pkg else name.split(".")[:-1]
        out = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(here[:len(here) - node.level + 1] + ([node.module] if node.module else [])) \
                    if node.level else (node.module or "")
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in files:      # `from x import name` names an attribute, not a module
                    t = t.rpartition(".")[0]
                if t.split(".")[0] == pkg_name and t != name:
                    out.add(t)
        edges[name] = out
    return edges


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def bad_edges(edges: dict[str, set[str]]) -> list[str]:
    bad = []
    for a, targets in sorted(edges.items()):
        allowed = ALLOWED.get(layer(a), set())
        for b in sorted(targets):
            if allowed is not TOP and layer(b) != layer(a) and layer(b) not in allowed:
                bad.append(f"{a} -> {b}")
    return bad


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


@pytest.fixture(scope="module")
def edges():
    return import_edges(ROOT / "webiree")


def test_every_package_has_a_layer(edges):
    assert sorted({layer(m) for m in edges} - set(ALLOWED)) == []


def test_imports_point_down(edges):
    assert bad_edges(edges) == []


def test_no_import_circles(edges):
    assert circles(edges) == []


def test_the_checks_can_fail(tmp_path):
    """A small package with an upward import and a circle is caught by both checks."""
    pkg = tmp_path / "webiree"
    for rel, text in {"__init__.py": "", "ir/__init__.py": "from ..compiler import driver\n",
                      "compiler/__init__.py": "", "compiler/driver.py": "from . import passes\n",
                      "compiler/passes.py": "def f():\n    from .driver import x\n"}.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    e = import_edges(pkg)
    assert bad_edges(e) == ["webiree.ir -> webiree.compiler", "webiree.ir -> webiree.compiler.driver"]
    assert circles(e) == [["webiree.compiler.driver", "webiree.compiler.passes"]]
