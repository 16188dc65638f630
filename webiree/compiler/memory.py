"""Memory planning: where every tensor lives on the GPU.

- Constants are packed into weight pages (one buffer each, no page over the
  adapter's max buffer size), each tensor aligned so it binds with an offset.
  Constants smaller than that alignment (biases, scales, zero points) go
  instead, word after word, into one *constant table* at the start of the
  first page (the tensor `CONST_TABLE`, its words read as u32 and bitcast):
  a kernel binds the whole table once for all the small constants it reads,
  and a model of many small tensors wastes no padding.
- Graph inputs get one buffer each (written with `writeBuffer`).
- Intermediates and outputs share one arena: each gets an offset, and two
  tensors may overlap in the arena when their lifetimes (first write to last
  read, in dispatch order) do not. Placement is greedy by size, the classic
  offline heuristic: largest first, lowest offset that does not collide.

The plan records peak arena bytes and the sum of all intermediates, so
`webiree inspect` can show the reuse.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import LimitsError
from ..ir.program import CONST_TABLE, Program, Tensor


def in_constant_table(t: Tensor, alignment: int) -> bool:
    """Whether constant `t` lives in the constant table (smaller than the binding offset alignment):
    the memory plan below and the fusion pass's binding count (compiler/passes.py) use this rule."""
    return t.kind == "const" and t.alias_of is None and t.nbytes < alignment


def align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


@dataclass
class Placement:
    buffer: int        # index into MemoryPlan.buffers
    offset: int
    size: int


@dataclass
class BufferDecl:
    kind: str          # 'weights' | 'input' | 'arena' | 'params'
    size: int
    name: str = ""


@dataclass
class MemoryPlan:
    buffers: list[BufferDecl]
    placement: dict[str, Placement]               # root tensor -> where it lives
    weights: list[tuple[str, int, int]]           # (const tensor, page buffer index, offset)
    arena_peak: int = 0
    intermediates_sum: int = 0
    max_live: int = 0
    lifetimes: dict = field(default_factory=dict)

    def summary(self) -> str:
        w = sum(b.size for b in self.buffers if b.kind == "weights")
        return (f"memory: weights {w} B in {sum(1 for b in self.buffers if b.kind == 'weights')} page(s); "
                f"arena peak {self.arena_peak} B vs. {self.intermediates_sum} B of intermediates "
                f"(largest live set {self.max_live} B)")


def plan_memory(prog: Program, limits: dict) -> MemoryPlan:
    alignment = int(limits.get("min_storage_buffer_offset_alignment", 256))
    max_binding = int(limits.get("max_storage_buffer_binding_size", 128 << 20))
    max_buffer = int(limits.get("max_buffer_size", 256 << 20))
    buffers: list[BufferDecl] = []
    placement: dict[str, Placement] = {}

    def check_binding(name, size):
        if size > max_binding:
            raise LimitsError(f"tensor {name!r} needs {size} bytes in one binding, above the adapter's "
                              f"maxStorageBufferBindingSize of {max_binding}",
                              hint="use a smaller input shape, or build with --limits adapter on a GPU that allows more")

    # constants: in order of first use; the small ones in the constant table (page 0, offset 0)
    weights = []
    page, page_size = None, 0
    seen = set()
    consts = []
    for op in prog.ops:
        for r in op.reads():
            root = prog.root(r)
            if prog.tensors[root].kind == "const" and root not in seen:
                seen.add(root)
                consts.append(root)
    table = [n for n in consts if in_constant_table(prog.tensors[n], alignment)]
    if table:
        buffers.append(BufferDecl("weights", 0, "weights0"))
        page = 0
        for name in table:
            t = prog.tensors[name]
            t.table_word = page_size // 4
            weights.append((name, page, page_size))
            page_size += max(t.nbytes, 4)
        check_binding(CONST_TABLE, page_size)
        prog.tensors[CONST_TABLE] = Tensor(CONST_TABLE, (page_size // 4,), "u32", kind="const")
        placement[CONST_TABLE] = Placement(page, 0, page_size)
        buffers[page].size = page_size
    for root in consts:
        t = prog.tensors[root]
        if t.table_word is not None:
            continue
        size = max(t.nbytes, 4)
        check_binding(root, size)
        if page is None or align(page_size, alignment) + size > max_buffer:
            buffers.append(BufferDecl("weights", 0, f"weights{len([b for b in buffers if b.kind == 'weights'])}"))
            page, page_size = len(buffers) - 1, 0
        off = align(page_size, alignment)
        placement[root] = Placement(page, off, size)
        weights.append((root, page, off))
        page_size = off + size
        buffers[page].size = align(page_size, 4)

    for name in prog.inputs:
        t = prog.tensors[name]
        size = max(t.nbytes, 4)
        check_binding(name, size)
        buffers.append(BufferDecl("input", size, name))
        placement[name] = Placement(len(buffers) - 1, 0, size)

    for name, t in prog.tensors.items():
        if t.kind == "params":      # the dims buffer (ir/sym.py): one i32 per symbol, written per run,
            size = align(max(t.nbytes, 16), 16)      # bound as a uniform array<vec4<i32>>
            buffers.append(BufferDecl("params", size, name))
            placement[name] = Placement(len(buffers) - 1, 0, size)

    # lifetimes of arena tensors (roots only; views share their root's placement)
    first, last = {}, {}
    n_ops = len(prog.ops)
    for i, op in enumerate(prog.ops):
        first.setdefault(op.out, i)
        last[op.out] = max(last.get(op.out, i), i)
        for r in op.reads():
            root = prog.root(r)
            if root in first:
                last[root] = max(last[root], i)
    for o in prog.outputs:
        root = prog.root(o)
        if root in first:
            last[root] = n_ops
    arena_tensors = sorted(first, key=lambda n: (-prog.tensors[n].nbytes, first[n]))
    placed: list[tuple[int, int, int, int]] = []   # (start, end, offset, size)
    peak = 0
    for name in arena_tensors:
        size = max(prog.tensors[name].nbytes, 4)
        check_binding(name, size)
        s, e = first[name], last[name]
        clashes = sorted((off, sz) for (s2, e2, off, sz) in placed if not (e2 < s or e < s2))
        off = 0
        for o2, sz2 in clashes:
            if off + size <= o2:
                break
            off = max(off, align(o2 + sz2, alignment))
        placed.append((s, e, off, size))
        placement[name] = Placement(-1, off, size)
        peak = max(peak, off + size)
    if peak > max_buffer:
        raise LimitsError(f"the activations need a {peak}-byte arena, above the adapter's maxBufferSize of {max_buffer}",
                          hint="use a smaller input shape")
    arena_index = len(buffers)
    buffers.append(BufferDecl("arena", align(max(peak, 4), 4), "arena"))
    for name in first:
        placement[name].buffer = arena_index

    live = [0] * (n_ops + 1)
    for name in first:
        for i in range(first[name], last[name] + 1):
            live[i] += prog.tensors[name].nbytes
    return MemoryPlan(buffers=buffers, placement=placement, weights=weights, arena_peak=peak,
                      intermediates_sum=sum(prog.tensors[n].nbytes for n in first), max_live=max(live, default=0),
                      lifetimes={n: (first[n], last[n]) for n in first})
