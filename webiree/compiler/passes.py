"""Program passes: dead-code elimination, folding a zero Pad into the Conv that
reads it, and fusion into dispatch regions.

`fold_pad_into_conv` runs first, on the program as lowering left it: a Conv
whose input is a Generic op that only zero-pads its spatial dims (Pad's
lowering marks such an op, `Generic.zero_pad`) reads the unpadded tensor
instead, with the pad added to its own pads; the pad then has no reader and
dce drops it.

Fusion has three rules, applied in order:

1. *Elementwise chains.* A Generic op read by Generic ops only is inlined
   into its readers (its expression substituted at the index they read), when
   it is read at one place or is cheap to recompute. Chains of elementwise
   and data-movement ops become one expression, so one dispatch.
2. *Epilogues.* An anchor (MatMul, Conv, Pool, Reduce, Softmax, LayerNorm)
   whose only reader is a Generic op that reads it element for element
   (at index `o`) absorbs that op as its epilogue: conv + bias + ReLU or
   Gemm + bias + GELU is one dispatch.

3. *Prologues.* A Generic op read only by one anchor (a transpose, a bias
   add, a scale) is computed inside the anchor's own loads of that input:
   attention's bias + transpose + 1/sqrt(d) feed the score MatMul directly.

No rule may exceed the number of storage buffers one kernel can bind.

`split_large_constants` runs before fusion: a constant larger than one binding
(`maxStorageBufferBindingSize`, 128 MiB by default: GPT-2's token embedding,
VGG's fc6) is cut into parts along its first axis, each a constant of its own.
A Generic op reading it (Gather, elementwise) selects the part by the flat
index; a MatMul reading it as B becomes one MatMul per part of B's columns, and
an ungrouped Conv reading it as its weight one Conv per part of the output
channels, and a Generic op concatenates their outputs. A constant read any
other way stays whole, and the memory planner refuses it naming the limit.

`fuse_matmul_chains` runs after fusion: a product whose result only the next product reads
(MobileBERT's feed-forward pairs, x @ W1 + b1, ReLU, @ W2 + b2 + x) becomes one MatMulChain, one
dispatch whose intermediate stays in workgroup memory. `fuse_attention` then makes Q Kᵀ (with its
fused mask and scale), the softmax over the keys and the product with V one Attention dispatch.

`combine_parallel_matmuls` runs after split_large_constants: products of one A with constant Bs of their own
(BERT's Q, K and V projections) become one product, their Bs side by side, and each original
output a Generic op reading its columns, which fusion then computes inside its readers.

`ranges_from_producers` runs after fusion: a DynamicQuantizeLinear's range is reduced by the
kernel that writes its input (a layernorm, a product and its GELU, attention), each workgroup
over what it stored, so the range-pack reads those partial minima instead of every value.

`lift_literals` runs after fusion: ops whose kernels are alike but for the constants written
into them (a quantized encoder's layers, each with its own scales and zero points) read those
values from a small constant of their own, so the layers share one executable.

`pack_constants` runs last: each constant is given the narrow storage form
that holds its values exactly (weights keep the size they were shipped in).
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from ..errors import LimitsError
from ..ir import kir, packing
from ..ir.mapped import release
from ..ir.sym import upper
from ..ir.program import O, Anchor, Attention, Conv, Generic, LayerNorm, MatMul, MatMulChain, Program, QuantizeWords, \
    Softmax, Tensor, acc_var, nibble_dequant
from .memory import in_constant_table

INLINE_COST = 8    # a producer this cheap may be recomputed by several readers
PROLOGUE_COST = 32  # a producer this cheap per element (kir.varying_cost) may be recomputed inside an anchor's input loads: an int8 attention K (dequantize, bias, two transposes) costs 26


def dce(prog: Program) -> Program:
    """Drop ops whose results nobody reads, then tensors nobody mentions."""
    needed = {prog.root(o) for o in prog.outputs}
    kept = []
    for op in reversed(prog.ops):
        if op.out in needed:
            kept.append(op)
            needed.update(prog.root(r) for r in op.reads())
    prog.ops = kept[::-1]
    # the dims buffer (kind 'params') stays though no expression loads it: kernels whose sizes are
    # symbolic (a matmul's M) read it for their bounds when they are built
    used = set(needed) | set(prog.inputs) | set(prog.outputs) | {n for n, t in prog.tensors.items()
                                                                 if t.kind == "params"}
    for op in prog.ops:
        used.add(op.out)
        if isinstance(op, Anchor):
            # an input computed by a fused prologue has no buffer, but its shape/dtype still describe the op
            used.update(op.prologues)
    # keep views whose root stays (graph outputs may be views)
    def live_view(t):
        while t.alias_of is not None:
            t = prog.tensors.get(t.alias_of)
            if t is None:       # its base was fused away
                return False
        return t.name in used
    prog.tensors = {n: t for n, t in prog.tensors.items() if n in used or (t.alias_of is not None and live_view(t))}
    return prog


def fold_pad_into_conv(prog: Program) -> Program:
    """Convs reading a zero pad of their input's spatial dims (as `x`) read the unpadded tensor
    instead, the pad added to their own pads, when nothing but such Convs reads the padded tensor
    (and it is no graph output). Runs before fusion: it reads `Generic.zero_pad`, which fusion clears."""
    outputs = {prog.root(o) for o in prog.outputs}
    readers = _readers(prog)
    for pad in prog.ops:
        if not isinstance(pad, Generic) or pad.zero_pad is None or pad.out in outputs:
            continue
        convs = readers.get(pad.out, [])
        shape = prog.tensors[pad.out].shape
        if not convs or any(not isinstance(c, Conv) or c.prologues or c.x != pad.out or c.w == pad.out
                            or tuple(c.x_shape) != shape for c in convs):
            continue   # another reader needs the padded tensor (or reads it through another shape)
        src, extra = pad.zero_pad
        for c in convs:
            c.x, c.x_shape = prog.root(src), tuple(prog.tensors[src].shape)
            c.pads = tuple(p + e for p, e in zip(c.pads, extra))
    return prog


def sink_zero_pads(prog: Program) -> Program:
    """A zero pad followed by elementwise ops that map 0 to 0 (a QDQ pair: quantize, dequantize) is
    rewritten as those ops on the unpadded tensor, then the pad: fold_pad_into_conv can then fold the
    pad into the Conv reading the chain. Only chains of Generics that read their one tensor input at
    their own index (other reads constants), ending in the pad's element type, are moved."""
    outputs = {prog.root(o) for o in prog.outputs}
    changed = True
    while changed:
        changed = False
        readers = _readers(prog)
        for pad in prog.ops:
            if not isinstance(pad, Generic) or pad.zero_pad is None:
                continue
            chain, t = [], pad.out
            while True:     # follow lone elementwise readers
                rs = readers.get(t, [])
                if len(rs) != 1 or not isinstance(rs[0], Generic) or rs[0].zero_pad is not None or t in outputs \
                        or not _elementwise_of(rs[0], t, prog):
                    break
                chain.append(rs[0])
                t = rs[0].out
            while chain and prog.tensors[chain[-1].out].dtype != prog.tensors[pad.out].dtype:
                chain.pop()
            if not chain:
                continue
            x = kir.load(pad.out, O, prog.tensors[pad.out].dtype)
            expr, prev = x, pad.out
            for g in chain:     # the chain as one expression of the pad's element x
                expr, prev = _inline(g.expr, Generic(name="", out=prev, nodes=[], expr=expr)), g.out
            if _eval_zero(kir.substitute(expr, {x: kir.const(0, x.dtype)})) is not True:
                continue
            src, extra = pad.zero_pad
            inner = prog.root(src)
            last = chain[-1]
            moved = last.out + ":unpadded"
            prog.tensors[moved] = dataclasses.replace(prog.tensors[inner], name=moved, kind="temp", data=None,
                                                      alias_of=None, dtype=prog.tensors[last.out].dtype)
            src_load = kir.load(inner, O, prog.tensors[inner].dtype)
            body = Generic(name=last.name + ":unpadded", out=moved, nodes=[n for g in chain for n in g.nodes],
                           expr=kir.substitute(expr, {x: src_load}))
            new_pad = Generic(name=pad.name, out=last.out, nodes=pad.nodes, zero_pad=(moved, extra),
                              expr=kir.substitute(pad.expr, {"__fn__": lambda n: kir.load(moved, n.args[0], n.dtype)
                                                             if n.op == "load" and n.attr == inner else None}))
            at = prog.ops.index(last)
            prog.ops[at:at + 1] = [body, new_pad]
            for g in chain[:-1]:
                prog.ops.remove(g)
            prog.ops.remove(pad)
            changed = True
            break
    return prog


def _in(g: Generic, prog: Program) -> str | None:
    """The one non-constant tensor an elementwise Generic reads."""
    ins = [r for r in g.reads() if prog.tensors[prog.root(r)].kind != "const"]
    return ins[0] if len(ins) == 1 else None


def _elementwise_of(g: Generic, t: str, prog: Program) -> bool:
    """g reads t only at its own index o, t has g's shape, and g reads no other run-time tensor."""
    loads = _loads_of_tensor(g.expr, t)
    return bool(loads) and all(ld.args[0] is O for ld in loads) and _in(g, prog) == t \
        and tuple(prog.tensors[t].shape) == tuple(prog.tensors[g.out].shape)


def _eval_zero(e) -> bool | None:
    """Whether the expression (no loads of run-time data left) is the value 0, when its few ops can
    be evaluated here; None when they cannot."""
    import math

    def ev(n):
        if n.op == "const":
            return n.attr
        a = [ev(x) for x in n.args]
        if any(v is None for v in a):
            return None
        if n.op in ("add", "sub", "mul"):
            return {"add": a[0] + a[1], "sub": a[0] - a[1], "mul": a[0] * a[1]}[n.op]
        if n.op == "div" and a[1] != 0:
            return a[0] / a[1] if n.dtype == "f32" else int(a[0] / a[1])
        if n.op == "round":
            return float(round(a[0]))          # (Python rounds half to even, as the kernels)
        if n.op == "cast":
            return float(a[0]) if n.dtype == "f32" else int(a[0]) if math.isfinite(a[0]) else None
        if n.op == "clamp":
            return min(max(a[0], a[1]), a[2])
        if n.op in ("min", "max"):
            return min(a) if n.op == "min" else max(a)
        if n.op == "neg":
            return -a[0]
        return None
    v = ev(e)
    return None if v is None else v == 0


def _moves_data(e) -> bool:
    """Whether `e` is one element of one tensor, possibly cast: a transpose, a slice, a broadcast."""
    while e.op == "cast":
        e = e.args[0]
    return e.op == "load" and len(kir.loads_of(e)) == 1


def _readers(prog: Program) -> dict[str, list]:
    out: dict[str, list] = {}
    for op in prog.ops:
        for r in op.reads():
            out.setdefault(r, []).append(op)
    return out


def _only_reader(readers: dict, outputs: set, t: str, op) -> bool:
    """Whether `op` is the one reader of `t`, which is no graph output (its producer may then be
    fused into `op`, the tensor dropped)."""
    return t not in outputs and [id(r) for r in readers.get(t, [])] == [id(op)]


def _loads_of_tensor(expr, name):
    return [n for n in kir.walk(expr) if n.op == "load" and n.attr == name]


def _inline(expr, producer: Generic):
    """Substitute every load of producer.out in expr by producer.expr at that index."""
    def fn(node):
        if node.op == "load" and node.attr == producer.out:
            return kir.substitute(producer.expr, {O: node.args[0]})
        return None
    return kir.substitute(expr, {"__fn__": fn})


def _bindings(prog: Program, reads, table_below: int) -> int:
    """Storage bindings a kernel reading `reads` needs: the small constants share one, the
    constant table (memory.in_constant_table; packing only makes a constant smaller). The dims
    buffer of a symbolic build is a uniform binding: not counted."""
    tensors = [t for r in {prog.root(r) for r in reads} if (t := prog.tensors.get(r)) is not None]
    tabled = [t for t in tensors if in_constant_table(t, table_below)]
    return sum(1 for t in tensors if t.kind != "params") - len(tabled) + (1 if tabled else 0)


def _bindings_after(prog: Program, op, extra_reads, table_below: int) -> int:
    """Bindings of `op`, its output's included, once it also reads `extra_reads`."""
    return _bindings(prog, set(op.reads()) | set(extra_reads), table_below) + 1


STACK_CONSTANT_BYTES = 4096     # constants this small may be stacked to save bindings (a bias, a norm's scale)


def _stack_constants(prog: Program, e, keep=()):
    """`e` with its loads of small constants (a bias, a NoNorm's scale and shift: one value a
    channel) of one element type read from one new constant, their values side by side, each
    load offset to its part: one binding instead of several, the same values and arithmetic.
    Used where a fusion would pass WebGPU's 8 storage bindings (MobileBERT's NoNorm chains after
    a product). The new constant is the same for every layer of a model, so their kernels stay
    one executable; the small constants are stored twice where something else still reads them.
    `keep`: tensors not to stack (read elsewhere by the same kernel). Returns `e` unchanged when
    fewer than two constants of a type qualify."""
    return _stack_constants_of(prog, [e], keep)[0]


def _stack_constants_of(prog: Program, exprs: list, keep=()) -> list:
    """`_stack_constants` over the expressions of one kernel (an Attention's prologues and
    epilogues): one stacked constant of each element type for all of them, `exprs` returned in
    order (None stays None)."""
    stacks, fn = _stacking(prog, exprs, keep)
    if not stacks:
        return list(exprs)
    prog.tensors.update(stacks)
    return [None if e is None else kir.substitute(e, {"__fn__": fn}) for e in exprs]


def _stacking(prog: Program, exprs: list, keep=(), max_bytes: int = STACK_CONSTANT_BYTES):
    """The stacking `_stack_constants_of` does, not yet applied: (the new constants, by name; the
    substitution function that moves each load to its part of one), ({}, a function changing
    nothing) where no type has two constants to stack. The caller adds the constants to `prog`."""
    groups: dict[str, list[str]] = {}
    for name in dict.fromkeys(n.attr for e in exprs if e is not None for n in kir.loads_of(e)):
        t = prog.tensors.get(name)
        if t is None or t.kind != "const" or t.data is None or t.alias_of is not None or name in keep:
            continue
        if 4 * t.data.size <= max_bytes:
            groups.setdefault(t.dtype, []).append(name)
    mapping, stacks = {}, {}
    count = sum(1 for n in prog.tensors if ':stack' in n)
    for dtype, names in groups.items():
        if len(names) < 2:
            continue
        offsets, at = {}, 0
        for n in names:
            offsets[n] = at
            at += prog.tensors[n].data.size
        sname = f"{names[0]}:stack{count + len(stacks)}"
        data = np.concatenate([np.ascontiguousarray(prog.tensors[n].data).reshape(-1) for n in names])
        stacks[sname] = Tensor(sname, (at,), dtype, kind="const", data=data)
        mapping.update({n: (sname, off) for n, off in offsets.items()})

    def fn(node):
        if node.op == "load" and node.attr in mapping:
            sname, off = mapping[node.attr]
            return kir.load(sname, kir.substitute(node.args[0], {"__fn__": fn}) + off, node.dtype)
        return None
    return stacks, fn


def fuse(prog: Program, max_bindings: int = 8, table_below: int = 256) -> Program:
    """Fuse elementwise work into anchors and into each other, within `max_bindings` storage
    bindings a kernel; `table_below`: the offset alignment under which a constant lives in the
    constant table (compiler/memory.py), all of a kernel's such constants one binding."""
    outputs = {prog.root(o) for o in prog.outputs}
    producer_of = {op.out: op for op in prog.ops}

    # 1. inline elementwise producers into elementwise readers
    changed = True
    while changed:
        changed = False
        readers = _readers(prog)
        for p in list(prog.ops):
            if not isinstance(p, Generic) or p.out in outputs:
                continue
            rs = readers.get(p.out, [])
            if not rs or not all(isinstance(r, Generic) for r in rs):
                continue
            cost = kir.varying_cost(p.expr, O)
            # data movement (a transpose: one load and its index arithmetic) read in place by each
            # reader: quantize_dynamic's range and packing of a transposed attention output
            cheap = cost <= INLINE_COST or (_moves_data(p.expr) and cost <= PROLOGUE_COST)
            # the packing of 8-bit values four to a word (ops/quant.py _words_of) reads each element
            # once: computed there, a quantization costs no more than stored
            once = len(rs) == 1 and rs[0].expr.op == "pack4i8"
            if not cheap and not once and (len(rs) > 1 or len(_loads_of_tensor(rs[0].expr, p.out)) > 1):
                continue
            new_exprs = []
            for r in rs:
                e = _inline(r.expr, p)
                reads = {n.attr for n in kir.loads_of(e)}
                if _bindings(prog, reads, table_below) + 1 > max_bindings:
                    e = _stack_constants(prog, e)
                    if _bindings(prog, {n.attr for n in kir.loads_of(e)}, table_below) + 1 > max_bindings:
                        break
                new_exprs.append(e)
            else:
                for r, e in zip(rs, new_exprs):
                    r.expr = e
                    r.zero_pad = None     # no longer a bare pad of a tensor
                    r.nodes = p.nodes + [n for n in r.nodes if n not in p.nodes]
                prog.ops.remove(p)
                changed = True
                break  # readers changed: recompute

    # 2. absorb a lone elementwise reader into an anchor's epilogue
    readers = _readers(prog)
    for a in list(prog.ops):
        if not isinstance(a, Anchor):
            continue
        while a.out not in outputs:
            rs = readers.get(a.out, [])
            if len(rs) != 1 or not isinstance(rs[0], Generic):
                break
            c = rs[0]
            loads = _loads_of_tensor(c.expr, a.out)
            if any(ld.args[0] is not O for ld in loads):
                break
            if prog.tensors[c.out].shape != prog.tensors[a.out].shape and \
                    _numel(prog.tensors[c.out].shape) != _numel(prog.tensors[a.out].shape):
                break
            acc = a.epilogue if a.epilogue is not None else kir.var("acc", prog.tensors[a.out].dtype)
            epi = kir.substitute(c.expr, {loads[0]: acc})
            extra = [n.attr for n in kir.loads_of(epi)]
            if _bindings_after(prog, a, extra, table_below) > max_bindings:
                # the epilogue's small constants side by side (those the anchor reads otherwise stay)
                others = set(a.reads()) - {n.attr for n in kir.loads_of(acc)}
                epi = _stack_constants(prog, epi, keep=others)
                old, a.epilogue = a.epilogue, epi
                over = _bindings(prog, a.reads(), table_below) + 1 > max_bindings
                a.epilogue = old
                if over:
                    break
            # the fused op runs where the reader ran (its other inputs exist by then)
            prog.ops.remove(a)
            prog.ops.insert(prog.ops.index(c), a)
            prog.ops.remove(c)
            del prog.tensors[a.out]
            a.out, a.epilogue = c.out, epi
            a.nodes = a.nodes + [n for n in c.nodes if n not in a.nodes]
            producer_of[a.out] = a
            readers = _readers(prog)

    # 3. compute elementwise producers inside the anchors that read them: a lone reader, or
    # several anchors that all read the producer's result as an operand (a quantized activation
    # shared by the Q, K and V products), each then computing it where it loads it
    def takes(a, t, p) -> bool:
        if t in a.prologues or t not in a.inputs():
            return False
        if isinstance(a, MatMul) and (a.a_words and t == a.a or a.int8 and t == a.b):
            return False    # an integer product's packed operands are stored once (ops/quant.py _words_of)
        if any(n.attr in a.prologues for n in kir.loads_of(p.expr)):
            return False
        # the prologue replaces the anchor's input loads only: a read of t by the epilogue
        # or by another prologue still needs t's buffer
        if a.epilogue is not None and _loads_of_tensor(a.epilogue, t) or \
                any(_loads_of_tensor(e, t) for e in a.prologues.values()):
            return False
        return _bindings(prog, (set(a.reads()) - {t}) | set(p.reads()), table_below) + 1 <= max_bindings

    for a in list(prog.ops):
        if not isinstance(a, Anchor):
            continue
        for t in a.inputs():
            p = producer_of.get(t)
            if not isinstance(p, Generic) or p not in prog.ops or t in outputs:
                continue
            rs = list({id(r): r for r in readers.get(t, [])}.values())
            if kir.varying_cost(p.expr, O) > PROLOGUE_COST or not rs or \
                    not all(isinstance(r, Anchor) and takes(r, t, p) for r in rs):
                continue
            for r in rs:
                r.prologues[t] = p.expr
                r.nodes = p.nodes + [n for n in r.nodes if n not in p.nodes]
            prog.ops.remove(p)
            readers = _readers(prog)
    return prog


# Chained products fused only where the intermediate is small: M x H values at most. A workgroup owns
# whole rows of it, so a larger one makes fewer, longer workgroups than two products' tiles give a GPU
# (MobileBERT's 128 x 512 intermediates qualify; MiniLM's 128 x 1,536 do not).
CHAIN_INTERMEDIATE = 65536


def fuse_matmul_chains(prog: Program, max_bindings: int, table_below: int, shared_bytes: int) -> Program:
    """A product whose result only the next product reads as its A (a feed-forward block: x @ W1 +
    b1, ReLU, then @ W2 + b2 + x) becomes one MatMulChain: the first product's epilogue is the
    chain's `mid`, the second's its epilogue, and the intermediate lives in workgroup memory
    (kernels/matmul_chain.py). Runs after fusion, on plain f32 2-D products with K, H and N
    multiples of 4, no prologues, no alpha, where one row of A and one of the intermediate fit
    `shared_bytes` of workgroup memory, the intermediate is at most CHAIN_INTERMEDIATE values
    and the chain binds at most `max_bindings` buffers."""
    outputs = {prog.root(o) for o in prog.outputs}
    producer = {op.out: op for op in prog.ops}

    def plain(op) -> bool:
        return isinstance(op, MatMul) and not (op.int8 or op.batch or op.a_batch or op.b_batch or op.prologues
                                               or op.trans_a or op.trans_b or op.alpha != 1.0) \
            and all(isinstance(v, int) and v % 4 == 0 for v in (op.k, op.n)) and isinstance(op.m, int) \
            and all(prog.tensors[prog.root(t)].dtype == "f32" for t in (op.a, op.b, op.out))

    readers = _readers(prog)
    for second in list(prog.ops):
        if not plain(second):
            continue
        first = producer.get(prog.root(second.a))
        if not plain(first) or not _only_reader(readers, outputs, first.out, second) or first.n != second.k \
                or first.m != second.m \
                or _numel(prog.tensors[second.a].shape) != first.m * first.n \
                or second.epilogue is not None and any(prog.root(ld.attr) == first.out
                                                       for ld in kir.loads_of(second.epilogue)):
            continue
        m, k, h, n = first.m, first.k, first.n, second.n
        if m * h > CHAIN_INTERMEDIATE or 4 * (k + h) > shared_bytes:
            continue
        chain = MatMulChain(name=f"{first.name}:chain", out=second.out, nodes=first.nodes + second.nodes,
                            epilogue=second.epilogue, a=first.a, b1=first.b, b2=second.b, m=m, k=k, h=h, n=n,
                            mid=first.epilogue)
        if _bindings(prog, chain.reads(), table_below) + 1 > max_bindings:
            continue
        prog.ops[prog.ops.index(second)] = chain
        prog.ops.remove(first)
        del prog.tensors[first.out]
        producer = {op.out: op for op in prog.ops}
        readers = _readers(prog)
    return prog


# Head sizes up to this many values fused into one Attention dispatch: an invocation holds its
# query row and its output row in registers (kernels/attention.py).
ATTENTION_HEAD_MAX = 128


def nan_guard() -> kir.Expr:
    """`Where(IsNaN(p), 0, p)` as a softmax's fused epilogue (what PyTorch's exporter writes after
    the softmax of scaled_dot_product_attention)."""
    acc = acc_var("f32")
    return kir.select(kir.unary("isnan", acc), kir.f32(0.0), acc)


def unrounded(epilogue: kir.Expr | None) -> kir.Expr | None:
    """A softmax's epilogue without its rounding of the probability to float16, where that rounding
    is all it does to the probability before an optional NaN guard: `round(p)` is None (no
    epilogue), `guard(round(p))` the guard; any other epilogue (a bfloat16 model's rounding
    included) is returned as it is."""
    acc = acc_var("f32")
    rounded = kir.unary("round_f16", acc)
    if epilogue == rounded:
        return None
    if epilogue is not None and epilogue == kir.substitute(nan_guard(), {acc: rounded}):
        return nan_guard()
    return epilogue


def fuse_attention(prog: Program, max_bindings: int, table_below: int, max_groups: int = 65535) -> Program:
    """Q @ Kt (its prologues and its epilogue: the heads' transposes, a scale, a mask), a softmax
    over its last axis and the product of the probabilities with V become one Attention
    (kernels/attention.py), where the scores and the probabilities are read by nothing else, every
    tensor is f32 (a float16 model's hold f32 values rounded to halves), the head sizes D and DV
    are at most ATTENTION_HEAD_MAX, the batches (heads) at most `max_groups` (a workgroup each
    along z) and the dispatch binds at most `max_bindings` buffers, its small constants stacked
    where that makes it fit (`_stacked_attention`). The softmax's epilogue is the
    NaN guard (`nan_guard`), or absent, or any other (a head mask's factor), which the kernels
    compute on each probability in a second pass over the keys. A float16 model's rounding of
    each probability to a half (onnxruntime's converter writes one) is dropped: the
    probabilities are never stored, so they stay f32 between the softmax and the product, and
    one pass serves (`unrounded`). Runs after fusion; the
    driver runs it for every target but a CPU-class one without subgroups, where the fused kernel
    (attention-online) took 2.7x the three dispatches' GPU time on lavapipe (with subgroups,
    attention-subgroup takes 0.39x of theirs)."""
    outputs = {prog.root(o) for o in prog.outputs}
    producer = {op.out: op for op in prog.ops}
    readers = _readers(prog)
    guard = nan_guard()

    def dtype(op, t) -> str:     # an input's element type, also where a prologue computes it
        return op.prologues[t].dtype if t in op.prologues else prog.tensors[prog.root(t)].dtype

    def plain(op, trans_b=False) -> bool:
        return isinstance(op, MatMul) and not (op.int8 or op.trans_a or (op.trans_b and not trans_b)) \
            and prog.tensors[op.out].dtype == "f32" and dtype(op, op.a) == dtype(op, op.b) == "f32"

    for pv in list(prog.ops):
        if not plain(pv) or pv.a in pv.prologues or pv.alpha != 1.0:
            continue
        sm = producer.get(prog.root(pv.a))
        if not isinstance(sm, Softmax) or sm.log or sm.inner != 1 or sm.prologues \
                or not _only_reader(readers, outputs, sm.out, pv):
            continue
        qk = producer.get(prog.root(sm.x))
        if not plain(qk, trans_b=True) or not _only_reader(readers, outputs, qk.out, sm) \
                or qk.n != sm.r or qk.n != pv.k or qk.m != pv.m \
                or tuple(qk.batch) != tuple(pv.batch) or tuple(pv.a_batch) != tuple(pv.batch) \
                or not isinstance(qk.k, int) or not isinstance(pv.n, int) \
                or qk.k > ATTENTION_HEAD_MAX or pv.n > ATTENTION_HEAD_MAX \
                or upper(_numel(pv.batch)) > max_groups:
            continue
        gone = {qk.out, sm.out}
        if any(prog.root(ld.attr) in gone for e in (qk.epilogue, sm.epilogue, pv.epilogue) if e is not None
               for ld in kir.loads_of(e)):
            continue
        prob = unrounded(sm.epilogue)
        prologues = dict(qk.prologues)
        if pv.b in pv.prologues:
            prologues[pv.b] = pv.prologues[pv.b]
        att = Attention(name=f"{qk.name}:attention", out=pv.out, nodes=qk.nodes + sm.nodes + pv.nodes,
                        epilogue=pv.epilogue, prologues=prologues,
                        q=qk.a, kt=qk.b, v=pv.b, batch=tuple(pv.batch), q_batch=tuple(qk.a_batch),
                        k_batch=tuple(qk.b_batch), v_batch=tuple(pv.b_batch), m=qk.m, d=qk.k, s=qk.n,
                        dv=pv.n, alpha=qk.alpha, score=qk.epilogue, guard=prob == guard,
                        prob=prob if prob not in (None, guard) else None, k_rows=qk.trans_b)
        if _bindings(prog, att.reads(), table_below) + 1 > max_bindings:
            att = _stacked_attention(prog, att)     # an integer model's biases and column sums
            if _bindings(prog, att.reads(), table_below) + 1 > max_bindings:
                continue
        prog.ops[prog.ops.index(pv)] = att
        prog.ops.remove(qk)
        prog.ops.remove(sm)
        for t in gone:
            del prog.tensors[t]
        producer = {op.out: op for op in prog.ops}
        readers = _readers(prog)
    return prog


def _stacked_attention(prog: Program, att: Attention) -> Attention:
    """`att` with the small constants of its prologues and epilogues stacked (`_stack_constants`):
    a quantize_dynamic encoder's Q, K and V each add a bias and a zero-point term of its own
    (column sums): with the mask and its output, MiniLM's bound 10 storage buffers where WebGPU
    allows 8; stacked, 6."""
    keys = list(att.prologues)
    exprs = _stack_constants_of(prog, [att.prologues[t] for t in keys] + [att.score, att.prob, att.epilogue],
                                keep={prog.root(t) for t in (att.q, att.kt, att.v)})
    prologues = dict(zip(keys, exprs[:len(keys)]))
    score, prob, epilogue = exprs[len(keys):]
    return dataclasses.replace(att, prologues=prologues, score=score, prob=prob, epilogue=epilogue)


def split_large_constants(prog: Program, max_binding: int) -> Program:
    """Cut each constant whose stored form exceeds `max_binding` bytes into parts along its first
    axis, where every reader can read parts (see the module docstring); returns `prog`."""
    readers = _readers(prog)
    outputs = {prog.root(o) for o in prog.outputs}
    for name, t in list(prog.tensors.items()):
        if t.kind != "const" or t.data is None or t.alias_of is not None or name in outputs:
            continue
        data = t.data
        if data.ndim == 0 or 4 * data.size <= max_binding:
            continue
        stored = packing.narrow_bytes(data)     # an int8 or f16 weight is stored narrow (pack_constants)
        if stored <= max_binding:
            continue
        ops = readers.get(name, [])
        if not ops or not all(_can_read_parts(op, name, data.size) for op in ops):
            continue
        per_elem = stored / data.size
        flat_parts: dict[tuple, str] = {}    # (first, end) flat element range -> its constant
        numbers = itertools.count()

        def add_part(chunk: np.ndarray) -> str:
            pname = f"{name}:part{next(numbers)}"
            prog.tensors[pname] = Tensor(pname, chunk.shape, t.dtype, kind="const", data=chunk)
            return pname

        def part(first: int, end: int) -> str:
            if (first, end) not in flat_parts:
                flat_parts[(first, end)] = add_part(data.reshape(-1)[first:end])
            return flat_parts[(first, end)]

        for op in ops:
            if isinstance(op, Generic):
                row = data.size // data.shape[0]
                ranges = _ranges(data.shape[0], row, per_elem, max_binding, name)
                op.expr = kir.substitute(op.expr, {"__fn__": lambda n: _part_load(n, name, ranges, row, part)})
            elif isinstance(op, Conv):
                _split_conv(prog, op, data, per_elem, max_binding, part)
            else:
                _split_matmul(prog, op, data, per_elem, max_binding, part, add_part)
        release(data)
    return dce(prog)


def combine_parallel_matmuls(prog: Program, max_binding: int) -> Program:
    """Products that read one A with constant Bs of their own (BERT's Q, K and V projections,
    MobileBERT's bottleneck and value projections of one hidden state) become one product whose
    B holds theirs side by side (TVM's CombineParallelDense): one dispatch instead of several.
    Each original output becomes a Generic op reading its columns of the combined one, which
    fusion then computes inside its readers (the bias add, the head transposes, the score
    product's loads). Only plain f32 2-D products with the same A, M, K, transposes and alpha
    are combined, each B a constant read by nothing else and stored in the same narrow form
    (packing.choose: an f16 weight stays f16 beside f16 ones), as many as fit one binding;
    their epilogue is none or the same rounding of each sum to float16 / bfloat16 (a half
    model's products), which the combined product keeps. Integer products (MatMul.int8: what
    quantize_dynamic and QDQ graphs become) combine alike where they read the same words of A
    with the same A offset and B zero point: their Bs are words [K/4, N], side by side too, and
    their i32 sums have no epilogue (each output's zero-point term, scales and bias are computed
    by its readers). A product whose result reaches a graph output through elementwise ops alone
    keeps its own dispatch: there its epilogue computes that output, where combined its columns
    would take a pass of their own. Products of 4-bit weights (MatMul.nibbles: MatMulNBits) combine
    where their weights' words, scales and zero points do, side by side along N, with one
    dequantization of the combined weight (`_nibble_key`). Returns `prog`."""
    outputs = {prog.root(o) for o in prog.outputs}
    readers = _readers(prog)
    producer = {op.out: op for op in prog.ops}
    acc = acc_var("f32")
    roundings = {None: None, kir.unary("round_f16", acc): "f16", kir.unary("round_bf16", acc): "bf16"}
    groups: dict[tuple, list[MatMul]] = {}
    for op in prog.ops:
        if isinstance(op, MatMul) and op.nibbles is not None:
            key = _nibble_key(prog, readers, outputs, producer, op)
            if key is not None:
                groups.setdefault(key, []).append(op)
            continue
        if not isinstance(op, MatMul) or op.batch or op.b_batch or op.a_batch \
                or op.prologues or op.epilogue not in roundings or op.out in outputs \
                or prog.tensors[op.out].rounded != roundings[op.epilogue] or op.int8 and op.epilogue is not None \
                or _elementwise_to_output(prog, readers, outputs, op.out):
            continue
        b, out = prog.tensors[op.b], prog.tensors[op.out]
        b_dtype, out_dtype, b_size = ("u32", "i32", op.n * op.k // 4) if op.int8 else ("f32", "f32", op.n * op.k)
        if b.kind != "const" or b.data is None or b.alias_of is not None or b.form is not None and not op.int8 \
                or b.dtype != b_dtype or out.dtype != out_dtype or len(readers.get(op.b, [])) != 1 \
                or op.a == op.b or not isinstance(op.n, int) or not isinstance(op.k, int) \
                or tuple(out.shape) != (op.m, op.n) or b.data.size != b_size:
            continue
        key = (prog.root(op.a), op.m, op.k, op.trans_a, op.trans_b, op.alpha, op.epilogue,
               op.int8, op.a_words, op.a_unsigned, op.b_zero, b.form, packing.choose(b.data))
        groups.setdefault(key, []).append(op)
    for key, group in groups.items():
        members, size = [], 0
        for op in group:    # the leading ones that fit one binding together
            b = prog.tensors[op.nibbles.words] if op.nibbles else prog.tensors[op.b]
            size += packing.stored_bytes(b.data, None if op.nibbles else key[-1])
            if size > max_binding:
                break
            members.append(op)
        if len(members) >= 2:
            (_combine_nibbles if members[0].nibbles else _combine)(prog, members)
    return prog


def _nibble_key(prog: Program, readers: dict, outputs: set, producer: dict, op: MatMul) -> tuple | None:
    """The group of a product of a 4-bit weight (MatMul.nibbles) that may combine with others:
    a plain 2-D product, not yet fused, whose B is the dequantization of its weight alone and
    whose weight's tensors nothing else reads; None where it cannot combine."""
    nib, deq = op.nibbles, producer.get(op.b)
    if op.batch or op.b_batch or op.a_batch or op.prologues or op.epilogue is not None or op.out in outputs \
            or _elementwise_to_output(prog, readers, outputs, op.out) or not isinstance(op.n, int) \
            or not isinstance(deq, Generic) or [id(r) for r in readers.get(op.b, [])] != [id(op)]:
        return None
    parts = [t for t in (nib.words, nib.scales, nib.zero_points) if t]
    if any(prog.tensors[t].kind != "const" or prog.tensors[t].data is None or prog.tensors[t].alias_of is not None
           or [id(r) for r in readers.get(t, [])] != [id(deq)] for t in parts):
        return None
    zero_dtype = prog.tensors[nib.zero_points].dtype if nib.zero_points else ""
    return ("nibbles", prog.root(op.a), op.m, op.k, op.trans_a, op.alpha, nib.block, nib.zero, zero_dtype,
            prog.tensors[nib.scales].dtype)


def _combine_nibbles(prog: Program, members: list) -> None:
    """`_combine` for products of 4-bit weights: their words, scales and zero points side by side
    ([K/8, N] and [K/block, N] each), dequantized by one Generic over the combined [K, N]."""
    first, n_total = members[0], sum(op.n for op in members)
    producer = {op.out: op for op in prog.ops}
    names = {}
    for field in ("words", "scales", "zero_points"):
        parts = [getattr(op.nibbles, field) for op in members]
        if not parts[0]:
            names[field] = ""
            continue
        t0 = prog.tensors[parts[0]]
        data = np.concatenate([np.asarray(prog.tensors[t].data) for t in parts], axis=1)
        names[field] = f"{parts[0]}:combined"
        prog.tensors[names[field]] = Tensor(names[field], data.shape, t0.dtype, kind="const", data=data)
        prog.tensors[names[field]].form = t0.form
        for t in parts:
            release(prog.tensors[t].data)
            del prog.tensors[t]
    nib = dataclasses.replace(first.nibbles, **names)
    deqs = [producer[op.b] for op in members]
    w = f"{first.b}:combined"
    prog.tensors[w] = Tensor(w, (first.k, n_total), "f32")
    zero_dtype = prog.tensors[nib.zero_points].dtype if nib.zero_points else "i32"
    deq = Generic(name=f"{deqs[0].name}:combined", out=w, nodes=[n for d in deqs for n in d.nodes],
                  expr=nibble_dequant(nib, n_total, O // n_total, O % n_total, zero_dtype))
    prog.ops = [op for op in prog.ops if not any(op is d for d in deqs)]
    for d in deqs:
        del prog.tensors[d.out]
    _replace_by_combined(prog, members, dataclasses.replace(first, b=w, nibbles=nib), [deq])


def _elementwise_to_output(prog: Program, readers: dict, outputs: set, t: str) -> bool:
    """Whether a graph output is computed from `t` by Generic ops alone (fusion would put them
    all in the epilogue of t's producer)."""
    todo, seen = [t], set()
    while todo:
        t = todo.pop()
        if t in outputs:
            return True
        if t not in seen:
            seen.add(t)
            todo += [prog.root(r.out) for r in readers.get(t, []) if isinstance(r, Generic)]
    return False


def _combine(prog: Program, members: list) -> None:
    """Replace the products `members` (one A, see combine_parallel_matmuls) by one product of
    their Bs side by side, at the first one's place, and a Generic op per original output."""
    first, n_total = members[0], sum(op.n for op in members)
    rows = first.k // 4 if first.int8 else first.k      # an integer product's B: words of 4 values of K
    parts = [np.ascontiguousarray(prog.tensors[op.b].data).reshape((op.n, rows) if op.trans_b else (rows, op.n))
             for op in members]
    data = np.concatenate(parts, axis=0 if first.trans_b else 1)
    bname = f"{first.b}:combined"
    prog.tensors[bname] = Tensor(bname, data.shape, prog.tensors[first.b].dtype, kind="const", data=data)
    prog.tensors[bname].form = prog.tensors[first.b].form    # (an integer product's words: i8 or u8)
    for op in members:
        release(prog.tensors[op.b].data)
        del prog.tensors[op.b]
    _replace_by_combined(prog, members, dataclasses.replace(first, b=bname), [])


def _replace_by_combined(prog: Program, members: list, combined: MatMul, before: list) -> None:
    """Put `combined` (the first member with the combined B, not yet renamed or widened), after
    the ops `before`, at the first member's place, and a Generic op per member reading its
    columns of the combined output in place of the members."""
    first, n_total = members[0], sum(op.n for op in members)
    oname, out_dtype = f"{first.out}:combined", prog.tensors[first.out].dtype
    prog.tensors[oname] = Tensor(oname, (first.m, n_total), out_dtype)
    prog.tensors[oname].rounded = prog.tensors[first.out].rounded   # the shared epilogue rounds it alike
    combined = dataclasses.replace(combined, name=f"{first.name}:combined", out=oname, n=n_total,
                                   nodes=[n for op in members for n in op.nodes])
    columns, at = [], 0
    for op in members:
        expr = kir.load(oname, (O // op.n) * n_total + (O % op.n) + at, out_dtype)
        columns.append(Generic(name=f"{op.name}:columns", out=op.out, nodes=[], expr=expr))
        at += op.n
    here = next(i for i, op in enumerate(prog.ops) if op is first)   # A exists here; the readers come later
    prog.ops = [op for op in prog.ops if not any(op is m for m in members)]
    prog.ops[here:here] = before + [combined] + columns


def _can_read_parts(op, name: str, size: int) -> bool:
    if isinstance(op, Generic):
        return True
    if isinstance(op, Conv):    # the weight of an ungrouped convolution: parts of its output channels
        return op.w == name and op.x != name and op.group == 1 and not op.prologues and op.epilogue is None
    # B of a plain 2-D matmul (Gemm, a linear layer, a tied LM head), not also its A
    return (isinstance(op, MatMul) and op.b == name and op.a != name and not op.b_batch
            and op.n * op.k == size and not op.prologues and op.epilogue is None)


def _ranges(rows: int, row_elems: int, per_elem: float, max_binding: int, name: str) -> list[tuple[int, int]]:
    """Rows [first, end) of each part: as many whole rows as one binding holds."""
    per_part = int(max_binding // (row_elems * per_elem))
    if per_part < 1:
        raise LimitsError(f"constant {name!r}: one row of its first axis ({row_elems:,} values) is larger than "
                          f"one binding (maxStorageBufferBindingSize {max_binding:,} bytes)",
                          hint="build for an adapter with a larger binding limit (--limits adapter)")
    return [(r, min(r + per_part, rows)) for r in range(0, rows, per_part)]


def _part_load(n, name, ranges, row, part):
    """A load of constant `name` at a flat index, as a select among the loads of its parts."""
    if n.op != "load" or n.attr != name:
        return None
    i = n.args[0]
    value = None
    for first, end in reversed(ranges):
        lo, hi = first * row, end * row
        here = kir.load(part(lo, hi), kir.clamp(i - lo, 0, hi - lo - 1), n.dtype)
        value = here if value is None else kir.select(i < hi, here, value)
    return value


def _split_matmul(prog, op: MatMul, data, per_elem, max_binding, part, add_part):
    """One MatMul per part of B's N columns, then a Generic op writing their outputs side by side."""
    n, k = op.n, op.k
    ranges = _ranges(n, k, per_elem, max_binding, op.b)
    if op.trans_b:      # B stored [N, K]: a part is a range of rows, a flat range of the constant
        bs = [part(a * k, e * k) for a, e in ranges]
    else:               # B stored [K, N]: a part is a range of columns, copied out contiguous
        bs = [add_part(np.ascontiguousarray(data.reshape(k, n)[:, a:e])) for a, e in ranges]
    parts = iter(bs)
    _replace_by_parts(prog, op, ranges, len(prog.tensors[op.out].shape) - 1, "cols",
                      lambda a, e, shape: dict(b=next(parts), n=e - a))


def _split_conv(prog, op: Conv, data, per_elem, max_binding, part):
    """One Conv per part of the weight's output channels (its first axis, a flat range of the
    constant), then a Generic op writing their outputs channel range by channel range."""
    m = op.w_shape[0]
    row = data.size // m
    ranges = _ranges(m, row, per_elem, max_binding, op.w)
    _replace_by_parts(prog, op, ranges, 1, "channels",
                      lambda a, e, shape: dict(w=part(a * row, e * row), w_shape=(e - a,) + tuple(op.w_shape[1:]),
                                               out_shape=shape))


def _replace_by_parts(prog, op, ranges, axis: int, label: str, fields):
    """Replace `op` by one copy per range [a, e) of its output's `axis` (fields(a, e, shape): what
    that copy changes besides its output) and a Generic op writing their outputs side by side."""
    out_t = prog.tensors[op.out]
    size, inner = out_t.shape[axis], _numel(out_t.shape[axis + 1:])
    at = prog.ops.index(op)
    new_ops, outs = [], []
    for j, (a, e) in enumerate(ranges):
        oname = f"{op.out}:{label}{j}"
        shape = tuple(out_t.shape[:axis]) + (e - a,) + tuple(out_t.shape[axis + 1:])
        prog.tensors[oname] = Tensor(oname, shape, out_t.dtype)
        new_ops.append(dataclasses.replace(op, name=f"{op.name}:{label}{j}", out=oname, prologues={}, epilogue=None,
                                           **fields(a, e, shape)))
        outs.append((a, e, oname))
    outer, i, pos = O // (size * inner), (O // inner if inner > 1 else O) % size, O % inner
    value = None
    for a, e, oname in reversed(outs):
        flat = outer * (e - a) + kir.clamp(i - a, 0, e - a - 1)
        here = kir.load(oname, flat * inner + pos if inner > 1 else flat, out_t.dtype)
        value = here if value is None else kir.select(i < e, here, value)
    new_ops.append(Generic(name=f"{op.name}:concat", out=op.out, nodes=list(op.nodes), expr=value))
    prog.ops[at:at + 1] = new_ops


LIFTED_TYPES = ("f32", "i32")


def _skeleton(prog: Program, op):
    """What `op`'s kernel is made of, as a hashable key, with its tensors named by order of first
    mention (with their kind, type, shape and form) and its value constants left out: f32
    constants, and i32 ones outside index arithmetic (a zero point; a stride or an offset stays in
    the key); and those constants' nodes in the same order. Two ops with the same key differ only
    in those values (and in which buffers they bind): the layers of a model."""
    names: dict[str, str] = {}
    count = itertools.count()       # the key's nodes, numbered across all of op's expressions
    literals: list[kir.Expr] = []

    def tok(name):
        if name not in names:
            t = prog.tensors[prog.root(name)] if name in prog.tensors else None
            kind = None if t is None else t.kind if t.kind in ("const", "params") else "buffer"
            names[name] = f"t{len(names)}" + ("" if t is None else f":{kind}:{t.dtype}:{t.shape}:{t.pack}:{t.ranges}")
        return names[name]

    def expr(e):
        nodes: list = []
        seen: dict = {}

        def visit(n, index: bool) -> int:     # index: under a load's index (strides, offsets)
            if (id(n), index) in seen:
                return seen[id(n), index]
            if n.op == "const" and n.dtype in LIFTED_TYPES and not index:
                literals.append(n)
                node = (n.op, n.dtype, "?", ())
            else:
                args = tuple(visit(a, index or n.op == "load") for a in n.args)
                node = (n.op, n.dtype, tok(n.attr) if n.op == "load" else repr(n.attr), args)
            seen[id(n), index] = next(count)
            nodes.append(node)
            return seen[id(n), index]
        visit(e, False)
        return tuple(nodes)

    def value(v):
        if isinstance(v, kir.Expr):
            return expr(v)
        if isinstance(v, dict):
            return tuple((value(k), value(x)) for k, x in v.items())
        if isinstance(v, (list, tuple)):
            return tuple(value(x) for x in v)
        if isinstance(v, str) and v in prog.tensors:
            return tok(v)
        return repr(v)
    key = (type(op).__name__,) + tuple(value(getattr(op, f.name)) for f in dataclasses.fields(op)
                                       if f.name not in ("name", "nodes"))
    return key, literals


def _bits(node: kir.Expr) -> int:
    """A constant's 32 bits (as the u32 word that holds it)."""
    if node.dtype == "f32":
        return int(np.array(node.attr, np.float32).view(np.uint32))
    return int(node.attr) & 0xFFFFFFFF


def lift_literals(prog: Program, max_bindings: int = 8, table_below: int = 256) -> Program:
    """Kernels that differ only in constants written into them become one executable: where two or
    more ops have the same skeleton (`_skeleton`: a quantized encoder's layers, whose per-tensor
    scales and zero points lowering writes into each kernel as literals), the constants that
    differ between them are read from a small constant of each op's own instead (u32 words, each
    bitcast to its type where it is read), bound like its other inputs (padded to `table_below`
    bytes, so it never joins the constant table, whose reads name their offsets in the code). A
    group in which some op has no binding left keeps its literals. MiniLM's default builds:
    quantize_dynamic 136 -> 41 executables (6.60 -> 1.65 MB of module), QDQ 146 -> 49 (5.38 ->
    1.54 MB)."""
    groups: dict = {}
    for i, op in enumerate(prog.ops):
        key, literals = _skeleton(prog, op)
        if literals:
            groups.setdefault(key, []).append((i, literals))
    for members in groups.values():
        if len(members) < 2:
            continue
        words = np.array([[_bits(n) for n in lits] for _, lits in members], dtype=np.uint32)
        differ = [p for p in range(words.shape[1]) if np.any(words[:, p] != words[0, p])]
        if not differ:
            continue
        if any(_bindings_after(prog, prog.ops[i], [], table_below) + 1 > max_bindings for i, _ in members):
            continue
        for (i, lits), row in zip(members, words):
            name = f"{prog.ops[i].out}:literals"
            data = np.zeros(max(len(differ), table_below // 4), np.uint32)
            data[:len(differ)] = row[differ]
            prog.tensors[name] = Tensor(name, (data.size,), "u32", kind="const", data=data)
            mapping = {lits[p]: kir.bitcast(kir.load(name, kir.i32(j), "u32"), lits[p].dtype)
                       for j, p in enumerate(differ)}
            prog.ops[i] = _substituted(prog.ops[i], mapping)
    return prog


def _substituted(op, mapping: dict):
    """`op` with `mapping` (constant node -> Expr) applied to every expression it holds, outside
    loads' indices (where the same constant stays: `_skeleton`)."""
    return dataclasses.replace(op, **_rewritten_fields(op, lambda node: node if node.op == "load" else mapping.get(node)))


def _rewritten_fields(op, fn) -> dict:
    """The fields of `op` that hold expressions, each rewritten by `fn` (kir.substitute's __fn__)."""
    def value(v):
        if isinstance(v, kir.Expr):
            return kir.substitute(v, {"__fn__": fn})
        if isinstance(v, dict):
            return {k: value(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            new = [value(x) for x in v]
            return v if all(a is b for a, b in zip(new, v)) else type(v)(new)
        return v
    return {f.name: value(getattr(op, f.name)) for f in dataclasses.fields(op)
            if isinstance(getattr(op, f.name), (kir.Expr, dict, list, tuple))}


# the kernels whose every store to their output is a final value, once per element (checked in
# their builders): the stored values are the tensor's values, so their minima are its range
RANGE_PRODUCERS = (LayerNorm, MatMul, Attention, Generic)


def ranges_from_producers(prog: Program) -> Program:
    """A range-pack (QuantizeWords) whose x is a temporary written whole by one op of
    RANGE_PRODUCERS, or a permutation of one computed by its prologue (attention's heads
    transposed back), reads its range from that tensor's tail (Tensor.ranges, ir/program.py):
    the op's kernel reduces what each of its workgroups stores (wgsl_codegen/kernels/quant_range.py),
    so the range-pack's workgroups read a partial minimum per producing workgroup instead of each
    scanning all of x (docs/performance.md, "DynamicQuantizeLinear's range in the producer")."""
    writers: dict = {}
    for op in prog.ops:
        writers.setdefault(prog.root(op.out), []).append(op)
    for op in prog.ops:
        if not isinstance(op, QuantizeWords):
            continue
        src = _permuted(op.prologues[op.x], op.n) if op.x in op.prologues else op.x
        root = prog.root(src) if src else None
        t, ws = (prog.tensors[root], writers.get(root, [])) if root else (None, [])
        if t is None or t.kind != "temp" or t.dtype != "f32" or t.rounded or len(ws) != 1 or ws[0].out != root \
                or not isinstance(ws[0], RANGE_PRODUCERS) or _numel(t.shape) != op.n:
            continue
        t.ranges = True
        op.partials = src
    return prog


def pack_in_products(prog: Program, max_bindings: int, table_below: int) -> Program:
    """An integer product whose A is words that one op writes for it alone gets that op as
    `MatMul.packer` (`b_packer` for B's); GPU variants then compute the words where the product
    loads them and drop the packer's dispatch (kernels/matmul_int8.py packed_here;
    docs/performance.md, "The packings in the products"). The packer is
    - an elementwise quantize-and-pack (a Generic: QDQ's QuantizeLinear of an activation, with what
      was fused into it), whose expression becomes the words' prologue; or
    - a range-pack that reads its range from a producer (QuantizeWords with partials:
      ranges_from_producers), which the product repeats: it reduces the producer's minima, then
      quantizes. Other ops may read the scale and zero point after the words (attention's
      prologue, for Q, K and V) where they run after the product, which then stores them.
    An elementwise packer of A that computes more than PACKER_MAX_COST a word stays a dispatch, and
    a pair that would pass `max_bindings` stacks its small constants to fit (_fits_packed) or
    stays two dispatches. CPU variants keep the packer's dispatch: a CPU renderer's register
    blocks would pack A again for every block of columns. Runs last before memory planning: the
    product's reads then include the packer's, so what it reads outlives the product in every
    variant."""
    readers: dict = {}
    for op in prog.ops:
        for r in op.reads():
            readers.setdefault(prog.root(r), []).append(op)
    at = {id(op): i for i, op in enumerate(prog.ops)}
    for q in prog.ops:
        if not (isinstance(q, QuantizeWords) and q.partials or isinstance(q, Generic) and prog.tensors[q.out].dtype == "u32"):
            continue
        words = prog.root(q.out)
        users = readers.get(words, [])
        if words in prog.outputs or words != q.out:
            continue
        b_side = [u for u in users if isinstance(q, Generic) and isinstance(u, MatMul) and u.int8
                  and prog.root(u.b) == words and prog.root(u.a) != words and not u.b_batch]
        if len(users) == 1 and b_side:      # B's words (a QDQ convolution's image), read by this product alone
            if _fits_packed(prog, b_side[0], q, lambda p, q: (set(p.reads()) - {p.b, words}) | set(q.reads()),
                            max_bindings, table_below):
                b_side[0].b_packer = q
            continue
        prods = [u for u in users if isinstance(u, MatMul) and u.int8 and u.a_words and prog.root(u.a) == words]
        if len(prods) != 1 or prods[0].batch:
            continue
        p = prods[0]
        if isinstance(q, Generic) and kir.cost(q.expr) > PACKER_MAX_COST:
            continue
        tail = {q.n // 4, q.n // 4 + 1} if isinstance(q, QuantizeWords) else set()   # the scale's and zero point's words

        def tail_only(op, a=None) -> bool:      # every read of the words (but A's) is of the tail
            if any(prog.root(t) == words for t in getattr(op, "inputs", lambda: [])()
                   if t != a and t not in getattr(op, "prologues", {})):
                return False
            return all(not (prog.root(n.attr) == words) or n.args[0].op == "const" and n.args[0].attr in tail
                       for e in _exprs_of(op) for n in kir.loads_of(e))
        # the others read the tail after the product (which then writes it), never before
        if not tail_only(p, p.a) or not all(tail_only(u) and at[id(u)] > at[id(p)] for u in users if u is not p):
            continue
        def reads(p, q):    # (a range-pack's product writes the words' tail: it binds them)
            return ((set(p.reads()) - {p.a, words}) | set(q.reads()) | {getattr(q, "partials", "")} - {""}
                    | ({words} if isinstance(q, QuantizeWords) else set()))
        if _fits_packed(prog, p, q, reads, max_bindings, table_below):
            p.packer = q
    return prog


# The most an elementwise packer of A may compute per word (kir.cost) to move into its product's
# loads, where every workgroup along the product's columns computes it again (QDQ MiniLM's products
# have 36-48 of them). A QuantizeLinear of a loaded value costs 37, one of a dequantized integer
# product 65-71. QDQ MiniLM's attention-output packings (103: the attention's result permuted) and
# FFN-out ones (117-133: the FFN-in product dequantized, GELU's erf), moved in besides those of
# 37, made the model 1.18x slower on an H100 (64 dispatches against 89; docs/performance.md, "The
# packings in the products"). B's packers (a convolution's image) are computed again per block of
# rows, of which a pointwise convolution has a few: they move in at any cost.
PACKER_MAX_COST = 96
PACKED_STACK_BYTES = 16384      # what a product and its packer may stack (a layer's biases, scales, column sums)


def _fits_packed(prog: Program, p, q, reads, max_bindings: int, table_below: int) -> bool:
    """Whether product `p` with packer `q` fits `max_bindings` (its output's included), `reads(p,
    q)` being what the pair reads. Where it would not, their expressions' small constants of each
    element type are stacked (`_stacking`; the constant table's are left as they are), and if that
    fits, `p` and `q` are rewritten in place to read the stacks: two of QDQ MobileNetV2's pointwise
    convolutions, whose image's packer finishes the depthwise convolution before them (its bias
    and clip) and whose epilogue adds the residual, each with lifted literals. The values and the
    arithmetic are the same; the CPU variants' packer dispatch reads the stack too."""
    if _bindings(prog, reads(p, q), table_below) + 1 <= max_bindings:
        return True
    exprs = _exprs_of(p) + _exprs_of(q)
    fields = {prog.root(t) for op in (p, q) for t in getattr(op, "inputs", lambda: [])()}
    fields |= {prog.root(q.partials)} if getattr(q, "partials", "") else set()
    tabled = {n.attr for e in exprs for n in kir.loads_of(e)
              if (t := prog.tensors.get(n.attr)) is not None and in_constant_table(t, table_below)}
    stacks, fn = _stacking(prog, exprs, keep=fields | tabled, max_bytes=PACKED_STACK_BYTES)
    if not stacks:
        return False
    for t in stacks.values():
        t.pack = packing.choose(t.data)     # (pack_constants has run)
    prog.tensors.update(stacks)
    changes = [_rewritten_fields(op, fn) for op in (p, q)]
    if _bindings(prog, reads(*(dataclasses.replace(op, **c) for op, c in zip((p, q), changes))), table_below) + 1 > max_bindings:
        for name in stacks:
            del prog.tensors[name]
        return False
    for op, c in zip((p, q), changes):
        for name, value in c.items():
            setattr(op, name, value)
    return True


def _exprs_of(op) -> list:
    """Every expression an op holds (its prologues, epilogue, a Generic's rule ...)."""
    out = []

    def visit(v):
        if isinstance(v, kir.Expr):
            out.append(v)
        elif isinstance(v, dict):
            for x in v.values():
                visit(x)
        elif isinstance(v, (list, tuple)):
            for x in v:
                visit(x)
    for f in dataclasses.fields(op):
        visit(getattr(op, f.name))
    return out


def _permuted(expr, n: int) -> str | None:
    """The tensor an expression of `o` reads, where it is one load of it whose index takes every
    value of [0, n) once as o does (a transpose, a reshape): then its values are the tensor's."""
    if expr.op != "load" or expr.dtype != "f32":
        return None
    ops = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.floor_divide, "mod": np.mod,
           "min": np.minimum, "max": np.maximum}
    memo: dict = {}

    def value(e):       # the index over o = 0 .. n-1, as int64 (None: not plain integer arithmetic)
        if e not in memo:
            if e.op == "const" and e.dtype == "i32":
                memo[e] = np.int64(e.attr)
            elif e is O:
                memo[e] = np.arange(n, dtype=np.int64)
            elif e.op in ops and e.dtype == "i32":
                a, c = value(e.args[0]), value(e.args[1])
                bad = a is None or c is None or e.op in ("div", "mod") and (np.any(a < 0) or np.any(c <= 0))
                memo[e] = None if bad else ops[e.op](a, c)
            else:
                memo[e] = None
        return memo[e]
    index = value(expr.args[0])
    if index is None or np.shape(index) != (n,) or index.min() < 0 or index.max() >= n:
        return None
    return expr.attr if np.unique(index).size == n else None


def pack_constants(prog: Program) -> Program:
    """Store every constant in the narrowest form that holds its values exactly (ir/packing.py):
    a float16 model's weights go back to halves, int8 and 4-bit weights to bytes. Kernels decode
    on load (wgsl_codegen/kernels/common.py Binder), so nothing else changes."""
    for t in prog.tensors.values():
        if t.kind == "const" and t.alias_of is None and t.data is not None:
            t.pack = packing.choose(t.data)
            release(t.data)     # a mapped weight's pages: read again when weights.bin is written
    return prog


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n
