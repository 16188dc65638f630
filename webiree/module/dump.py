"""`webiree inspect`: a schedule module and its manifest as text (after iree-dump-module)."""

from __future__ import annotations

from ..dtypes import name_of
from .folder import BuildFolder
from .format import variant_counts


def describe_build(path) -> str:
    folder = BuildFolder(path)
    raw = folder.module_bytes()
    m = folder.module(raw)
    manifest = folder.manifest()
    info = m.info
    lines = [f"model {info.get('model', '?')} (webiree {manifest.get('webiree_version', '?')})",
             f"schedule module: {len(raw)} bytes, {len(m.executables)} executables, {len(m.commands)} commands"]
    if m.symbols:
        lines.append("symbolic dims (one build serves every size in range): " +
                     ", ".join(f"{n} in {lo}..{hi}" for n, lo, hi in m.symbols))
    exprs = info.get("shapes", {})
    for io in m.inputs:
        shape = "[" + ", ".join(exprs[io.name]) + "]" if io.name in exprs else list(io.shape)
        lines.append(f"input  {io.name}: {shape} {name_of(io.onnx_type)} (stored {io.dtype})")
    for io in m.outputs:
        shape = "[" + ", ".join(exprs[io.name]) + "]" if io.name in exprs else list(io.shape)
        lines.append(f"output {io.name}: {shape} {name_of(io.onnx_type)} (stored {io.dtype})")
    lines.append("buffers:")
    for i, b in enumerate(m.buffers):
        lines.append(f"  #{i} {b.kind:<8} {b.size:>12} B  {b.name}")
    mem = info.get("memory", {})
    lines.append(f"memory plan: arena peak {mem.get('arena_peak', 0)} B vs. {mem.get('intermediates_sum', 0)} B "
                 f"sum of intermediates (largest live set {mem.get('max_live', 0)} B); weights {mem.get('weights', 0)} B")
    forms = mem.get("weights_by_form")
    if forms:
        lines.append("  weights stored as: " + ", ".join(f"{form} {n} B" for form, n in forms.items()) +
                     " (each constant in the narrowest form holding its values exactly; kernels decode on load)")
    if m.symbols:
        lines.append("  (planned for the largest sizes: " + ", ".join(f"{n}={hi}" for n, _, hi in m.symbols) +
                     "; a run at a smaller size uses a prefix of each tensor's place)")
    counts = variant_counts(m)
    if counts:
        total = sum(c["executables"] for c in counts)
        lines.append(f"kernel variants: {len(counts)}, {len(m.executables)} unique executables ({total} dispatched in "
                     f"all, {total - len(m.executables)} shared); a session runs the one its adapter's rule picks")
        lines += [f"  {c['name']:<7} rule {c['rule']}: {c['executables']} executables ({c['shared']} also in "
                  f"another variant)" + (f"; the start tier of {c['name'].removesuffix('-start')} (webiree.js runs it "
                                         "while those compile)" if c["rule"].endswith(",start=1") else "")
                  for c in counts]
    for v in m.variants or [None]:
        ds = (v.info if v else info).get("dispatches", [])
        lines.append(f"dispatches: {len(ds)}{f' (variant {v.name})' if v else ''}")
        for i, dd in enumerate(ds):
            cfg = dd.get("config", {})
            lines.append(f"  {i:>4} {dd['kind']:<9} {dd['name']:<32} grid {tuple(dd['grid'])} wg "
                         f"{tuple(cfg.get('workgroup_size', ()))} {cfg.get('strategy', '')} exec {dd['exec']}" +
                         (f"  [{dd['precision']}]" if dd.get("precision") else "") + f"  fuses {dd['nodes']}")
    views = info.get("views", [])
    lines.append(f"views (no dispatch): {len(views)}")
    return "\n".join(lines)
