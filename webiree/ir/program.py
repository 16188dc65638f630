"""The canonical program: the few op kinds code generation understands.

Lowering maps every ONNX op onto these (DESIGN.md contract 2):

- `Generic`  out[o] = expr: elementwise math *and* data movement. `expr` is a
             kernel-IR expression of the flat output index `o` (var 'o', i32)
             that reads other tensors with `load(tensor_name, flat_index)`.
             Transpose, Slice, Gather, Concat, Pad, Expand, Where, Resize ... are
             all Generic ops with different index maps.
- `MatMul`   batched contraction C = alpha * A @ B (+ epilogue).
- `Conv`     N-d grouped convolution (+ epilogue).
- `Pool`     max / average / Lp pooling windows (+ epilogue).
- `Reduce`   reduction of the middle axis of an [outer, R, inner] view, with
             kinds sum/max/min/prod/mean/... (+ epilogue).
- `MatMulChain` two chained products in one dispatch, the first's result kept in
             workgroup memory (a feed-forward block: compiler/passes.py fuse_matmul_chains).
- `Attention` Q Kᵀ, softmax and x V in one dispatch, the scores never stored
             (compiler/passes.py fuse_attention).
- `Softmax`  (log-)softmax over the middle axis of [outer, R, inner].
- `LayerNorm` normalization over the last R elements with scale/bias.
- `Loop`     a sequential fold per output element (at the end of this file).

An anchor op (everything but Generic) may carry an `epilogue`: an expression
of var 'acc' (the op's own result for one element, see `acc_var`) and var 'o' (that
element's flat index), so a bias add and activations run in the same
dispatch. Reshape-like ops produce *views* (`Tensor.alias_of`) and no op.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import kir
from .kir import Expr
from .sym import Dim, upper

O = kir.var("o", "i32")          # flat output index inside Generic exprs and epilogues


CONST_TABLE = "__const_table"    # the small constants, one u32 array bound once per kernel (compiler/memory.py)


def acc_var(dtype: str = "f32"):
    """An anchor's own result for one element, inside its epilogue."""
    return kir.var("acc", dtype)


def numel(shape):
    """Element count: an int, or a symbolic Dim (ir/sym.py) when the shape has one."""
    n = 1
    for d in shape:
        n *= d if isinstance(d, Dim) else int(d)
    return n


def strides_of(shape) -> list:
    out, s = [], 1
    for d in reversed(shape):
        out.append(s)
        s *= d if isinstance(d, Dim) else int(d)
    return out[::-1]


def coords_of(flat: Expr, shape) -> list[Expr]:
    """Row-major coordinates of a flat index (< numel(shape)).

    The first dim larger than 1 takes no modulo (the index is in range); size-1
    dims are the constant 0. `flat_of` relies on this canonical form."""
    st = strides_of(shape)
    out, leading = [], True
    for n, s in zip(shape, st):
        if n == 1:
            out.append(kir.i32(0))
            continue
        c = flat // s if s != 1 else flat
        if not leading:
            c = c % n
        leading = False
        out.append(c)
    return out


def flat_of(coords, shape) -> Expr:
    """Flat row-major index of coordinates; the coordinates of `o` itself give back `o`."""
    if numel(shape) == 1:
        return kir.i32(0)
    if len(coords) == len(shape) and all(a is b for a, b in zip(coords, coords_of(O, shape))):
        return O
    idx = kir.i32(0)
    for c, s, n in zip(coords, strides_of(shape), shape):
        if n != 1:
            idx = idx + c * s
    return idx


@dataclass
class Tensor:
    name: str
    shape: tuple
    dtype: str                  # 'f32' | 'i32' | 'u32' | 'bool'
    kind: str = "temp"          # 'input' | 'output' | 'const' | 'temp' | 'params' (the dims buffer)
    data: np.ndarray | None = None   # for constants (already in the internal dtype)
    alias_of: str | None = None      # for views: the tensor whose buffer this reuses
    pack: str | None = None          # constants: the narrow form weights.bin stores it in (ir/packing.py)
    table_word: int | None = None    # a small constant: its first word in the constant table (compiler/memory.py)
    rounded: str | None = None       # 'f16' / 'bf16': an f32 tensor whose every value is one of that type
                                     # (lowering.round_narrow_outputs); f16 ones may be stored as halves
    form: str | None = None          # constants held in a plain type but shipped narrower, as inspect reports
                                     # them: 'i8' / 'u8' for 8-bit weights packed four to a word (ops/quant.py)
    ranges: bool = False             # the RANGE_SLOTS tail after the values (below): its producer reduces
                                     # a DynamicQuantizeLinear's range there (compiler/passes.py ranges_from_producers)

    @property
    def nbytes(self) -> int:
        """Bytes at the largest size the declared ranges allow (what memory is planned for)."""
        if self.pack is not None:
            from .packing import PACKS
            per_word = 32 // PACKS[self.pack].bits
            return 4 * -(-upper(numel(self.shape)) // per_word)
        return 4 * upper(numel(self.shape)) + (16 * (RANGE_SLOTS + 1) if self.ranges else 0)


# A DynamicQuantizeLinear's range reduced where its input is written: after the n values (n % 4 == 0)
# of a tensor with `ranges` come RANGE_SLOTS + 1 vec4s, the first holding (as f32) how many slots its
# producer wrote (0: none; the range-pack then scans the values), slot i + 1 the minima of x and of -x
# over what workgroup i stored (wgsl_codegen/kernels/quant_range.py)
RANGE_SLOTS = 1024


@dataclass
class Op:
    name: str
    out: str
    nodes: list[str]            # the ONNX nodes this op stands for (grows with fusion)

    def reads(self) -> list[str]:
        raise NotImplementedError

    @property
    def kind(self) -> str:
        return type(self).__name__.lower()


def _expr_reads(e: Expr | None) -> list[str]:
    if e is None:
        return []
    seen, out = set(), []
    for n in kir.loads_of(e):
        if n.attr not in seen:
            seen.add(n.attr)
            out.append(n.attr)
    return out


@dataclass
class Generic(Op):
    expr: Expr = None
    # (source tensor, begin... end... pads of its spatial dims) when this op only pads the spatial
    # dims of an N, C, *spatial tensor with zeros (Pad's lowering says so); read by the pass that
    # folds such a pad into the Conv reading it. Fusion clears it when it rewrites `expr`.
    zero_pad: tuple | None = None

    def reads(self):
        return _expr_reads(self.expr)


@dataclass
class Anchor(Op):
    epilogue: Expr | None = None
    # input tensor -> the Generic expression (of var 'o') computing it: the anchor
    # reads that input through the expression instead of from a buffer
    prologues: dict = field(default_factory=dict)

    def inputs(self) -> list[str]:
        raise NotImplementedError

    def reads(self):
        out = []
        for t in self.inputs():
            for r in (_expr_reads(self.prologues[t]) if t in self.prologues else [t]):
                if r not in out:
                    out.append(r)
        for r in _expr_reads(self.epilogue):
            if r not in out:
                out.append(r)
        return out


@dataclass(frozen=True)
class Nibbles:
    """A [K, N] weight of 4-bit blocks along K (compiler/ops/contrib_quant.py): `words` u32
    [K/8, N], word (w, n) holding q[8w .. 8w+7, n] four bits each, the lowest first; `scales`
    [K/block, N]; `zero_points` [K/block, N] (integers 0..15, or floats) or '' for the constant
    `zero`. Element (k, n) is nibble_value(q[k, n], zero point, scale) of block k // block."""
    words: str
    scales: str
    zero_points: str
    zero: int
    block: int


def nibble_value(q: Expr, zero: Expr, scale: Expr) -> Expr:
    """A block-quantized weight's value (MatMulNBits): (q - zero) * scale, q an i32, zero an
    i32 (subtracted exactly in integers) or an f32 (onnxruntime's float zero points)."""
    if zero.dtype == "f32":
        return (kir.cast(q, "f32") - zero) * scale
    return kir.cast(q - zero, "f32") * scale


def nibble_of(word: Expr, shift: Expr) -> Expr:
    """The 4-bit value at bit `shift` (a u32) of a u32 word, as an i32."""
    return kir.cast(kir.binary("band", kir.binary("shr", word, shift), kir.const(15, "u32")), "i32")


def nibble_dequant(nib: Nibbles, n_cols, k: Expr, n: Expr, zero_dtype: str = "i32") -> Expr:
    """Element (k, n) of the [K, n_cols] weight `nib` describes, from loads of its tensors (its
    zero points' internal type `zero_dtype`: i32 for integers, f32 for floats): the prologue of
    the product that reads it (compiler/ops/contrib_quant.py, compiler/passes.py)."""
    word = kir.load(nib.words, kir.binary("shr", k, kir.i32(3)) * n_cols + n, "u32")
    q = nibble_of(word, kir.cast(kir.binary("shl", kir.binary("band", k, kir.i32(7)), kir.i32(2)), "u32"))
    s = kir.binary("shr", k, kir.i32(nib.block.bit_length() - 1)) * n_cols + n
    zero = kir.load(nib.zero_points, s, zero_dtype) if nib.zero_points else kir.i32(nib.zero)
    return nibble_value(q, zero, kir.load(nib.scales, s, "f32"))


@dataclass
class MatMul(Anchor):
    a: str = ""
    b: str = ""
    batch: tuple = ()           # output batch dims
    a_batch: tuple = ()         # A's batch dims (broadcast to `batch`)
    b_batch: tuple = ()
    m: int = 0
    n: int = 0
    k: int = 0
    trans_a: bool = False       # A stored as [K, M]
    trans_b: bool = False       # B stored as [N, K]
    alpha: float = 1.0
    # An integer product of 8-bit values (MatMulInteger, QLinearMatMul), exact in i32: B is u32
    # words [K/4, N], word (w, n) holding B'[4w .. 4w+3, n] as signed bytes (the lowest first); A is
    # likewise words [M, K/4] of A'[m, 4w .. 4w+3] (`a_words`), or integers (i32 elements, or
    # computed by its prologue) of [0, 255] when `a_unsigned`, else of [-128, 127], A' = A - 128
    # when `a_unsigned`, else A. The i32 result is sum_k A'[m, k] B'[k, n] - b_zero * sum_k A'[m, k]
    # (kernels/matmul_int8.py; compiler/ops/quant.py).
    int8: bool = False
    a_words: bool = False
    a_unsigned: bool = False
    b_zero: int = 0
    # A 4-bit weight (MatMulNBits) whose dequantization is B's fused prologue, described for the
    # kernels that read its words whole (kernels/matmul.py _nibbles): a Nibbles of the constants
    # that prologue reads; the other kernels compute B through the prologue (the same values)
    nibbles: "Nibbles | None" = None
    # The op writing A's words, where this product alone reads them (compiler/passes.py
    # pack_in_products): a range-pack whose range its producer recorded (QuantizeWords), or an
    # elementwise quantize-and-pack (a Generic: QDQ's QuantizeLinear of an activation). A GPU
    # variant computes the words in the product's loads and drops that op's dispatch; the other
    # variants read the words. Its reads count as this product's, so they outlive the product.
    packer: "Op | None" = None
    b_packer: "Op | None" = None    # likewise for B's words: an elementwise packer (a QDQ convolution's image)

    def inputs(self):
        return [self.a, self.b]

    def reads(self):
        out = super().reads()
        for packer in (self.packer, self.b_packer):
            if packer is not None:
                out += [r for r in packer.reads() + [getattr(packer, "partials", "")] if r and r not in out]
        return out


@dataclass
class MatMulChain(Anchor):
    """out = epilogue(mid(A @ B1) @ B2) for an f32 A [M, K], B1 [K, H], B2 [H, N] (row-major, no
    batch): a feed-forward block whose intermediate [M, H] never reaches a buffer, since a workgroup
    computes a few whole rows of it into workgroup memory and then their rows of the result
    (kernels/matmul_chain.py). `mid` is the first product's fused epilogue, an expression of var
    'acc' and of var 'o', the element's flat index in [M, H] (a bias and an activation); `epilogue`
    is the second's, of 'acc' and 'o' in [M, N] (a bias, a residual, a scale)."""
    a: str = ""
    b1: str = ""
    b2: str = ""
    m: int = 0
    k: int = 0
    h: int = 0
    n: int = 0
    mid: Expr | None = None

    def inputs(self):
        return [self.a, self.b1, self.b2]

    def reads(self):
        out = super().reads()
        return out + [r for r in _expr_reads(self.mid) if r not in out]


@dataclass
class Attention(Anchor):
    """out = epilogue(softmax_j(score(alpha * Q @ Kt)) @ V) over batched Q [.., M, D], Kt [.., D, S]
    (K transposed, as the first product reads it; K [.., S, D] itself where `k_rows`) and V
    [.., S, DV], the softmax along S: scaled dot-product attention whose [.., M, S] scores and
    probabilities never reach a buffer
    (kernels/attention.py: online softmax over blocks of keys). `score` is the first product's
    fused epilogue (a mask, a scale: an expression of var 'acc' and of var 'o', the flat index in
    [batch, M, S]), `guard` says the softmax's epilogue was ONNX exports' `Where(IsNaN(p), 0, p)`
    (a row whose every score is -inf gives 0, not NaN), `epilogue` is the second product's (of
    'acc' and 'o' in [batch, M, DV]). `q_batch`, `k_batch`, `v_batch` broadcast to `batch` as a
    MatMul's a_batch / b_batch do; `alpha` scales the first product."""
    q: str = ""
    kt: str = ""
    v: str = ""
    batch: tuple = ()
    q_batch: tuple = ()
    k_batch: tuple = ()
    v_batch: tuple = ()
    m: int = 0
    d: int = 0
    s: int = 0
    dv: int = 0
    alpha: float = 1.0
    score: Expr | None = None
    guard: bool = False
    prob: Expr | None = None    # the softmax's fused epilogue where it is not the NaN guard (a head
                                # mask's factor): computed on each probability, in a second pass over the keys
    k_rows: bool = False        # `kt` is stored as K itself, [.., S, D] (the first product's trans_b)

    def inputs(self):
        return [self.q, self.kt, self.v]

    def reads(self):
        out = super().reads()
        for e in (self.score, self.prob):
            out += [r for r in _expr_reads(e) if r not in out]
        return out


@dataclass
class Conv(Anchor):
    x: str = ""
    w: str = ""
    x_shape: tuple = ()         # N, C, *spatial
    w_shape: tuple = ()         # M, C/group, *kernel
    out_shape: tuple = ()
    strides: tuple = ()
    dilations: tuple = ()
    pads: tuple = ()            # begin..., end...
    group: int = 1

    def inputs(self):
        return [self.x, self.w]


@dataclass
class Pool(Anchor):
    x: str = ""
    mode: str = "max"           # 'max' | 'avg' | 'lp'
    x_shape: tuple = ()
    out_shape: tuple = ()
    kernel: tuple = ()
    strides: tuple = ()
    dilations: tuple = ()
    pads: tuple = ()
    count_include_pad: bool = False
    p: float = 2.0

    def inputs(self):
        return [self.x]


@dataclass
class Reduce(Anchor):
    x: str = ""
    mode: str = "sum"           # sum mean max min prod l1 l2 logsum logsumexp sumsquare argmax argmin
    outer: int = 1
    r: int = 1
    inner: int = 1
    select_last: bool = False   # ArgMax/ArgMin select_last_index

    def inputs(self):
        return [self.x]


@dataclass
class Softmax(Anchor):
    x: str = ""
    outer: int = 1
    r: int = 1
    inner: int = 1
    log: bool = False

    def inputs(self):
        return [self.x]


@dataclass
class LayerNorm(Anchor):
    x: str = ""
    scale: str = ""
    bias: str = ""              # '' when absent
    outer: int = 1
    r: int = 1
    eps: float = 1e-5

    def inputs(self):
        return [t for t in (self.x, self.scale, self.bias) if t]


@dataclass
class QuantizeWords(Anchor):
    """DynamicQuantizeLinear's range and its packing for integer products, in one dispatch: of an
    f32 x of n values (n % 4 == 0), scale = (max(x, 0) - min(x, 0)) / 255, zero point
    zp = round(clip(-min(x, 0) / scale, 0, 255)), q = clip(round(x / scale) + zp, 0, 255); the u32
    output holds words[w] = q[4w .. 4w+3] - 128 as signed bytes (the lowest first, what an
    integer product's `a_words` reads) for w < n / 4, then bitcast(scale) and zp
    (kernels/matmul_int8.py build_quantize_words; compiler/ops/quant.py)."""
    x: str = ""
    n: int = 0
    partials: str = ""          # the tensor whose tail holds x's range, reduced by its producer: x, or
                                # the tensor x's prologue permutes (Tensor.ranges)

    def inputs(self):
        return [self.x]


# DynamicQuantizeLinear's arithmetic (ONNX spec, uint8), written once for the dispatches that
# compute it: the scale and zero point of x_min = min(min(x), 0) and neg_max = min(-max(x), 0), and
# a value's quantized q (compiler/ops/quant.py; kernels/matmul_int8.py build_quantize_words)
def dynamic_quant_scale(x_min: Expr, neg_max: Expr) -> Expr:
    return (-neg_max - x_min) / 255.0


def dynamic_quant_zero_point(x_min: Expr, scale: Expr) -> Expr:
    return kir.cast(kir.unary("round", kir.clamp(0.0 - x_min / scale, 0.0, 255.0)), "i32")


def dynamic_quant_value(x: Expr, scale: Expr, zp: Expr) -> Expr:
    return kir.clamp(kir.cast(kir.unary("round", x / scale), "i32") + zp, 0, 255)


@dataclass
class Program:
    name: str
    tensors: dict[str, Tensor]
    ops: list[Op]
    inputs: list[str]
    outputs: list[str]                              # internal tensor names, in graph output order
    output_names: list[str] = field(default_factory=list)   # the ONNX names of those outputs
    io_types: dict = field(default_factory=dict)    # tensor -> ONNX elem_type at the boundary
    symbols: list = field(default_factory=list)     # ir/sym.Symbol by dims-buffer index (dynamic builds)
    constraints: list = field(default_factory=list)  # (size, size, what): equal in every run (checked then)

    def root(self, name: str) -> str:
        t = self.tensors[name]
        while t.alias_of is not None:
            t = self.tensors[t.alias_of]
        return t.name

    def summary(self) -> str:
        lines = [f"program {self.name}: {len(self.ops)} ops"]
        for op in self.ops:
            t = self.tensors[op.out]
            lines.append(f"  {op.kind:<9} {op.name:<28} -> {op.out} {t.shape} {t.dtype}  reads {op.reads()}  from {op.nodes}")
        return "\n".join(lines)


def op_flops(op: Op) -> int:
    """Floating-point operations of a contraction or convolution (2 per multiply-add, at the largest
    declared size); 0 otherwise."""
    if isinstance(op, MatMul):
        return upper(2 * max(upper(numel(op.batch)), 1) * op.m * op.n * op.k)
    if isinstance(op, MatMulChain):
        return upper(2 * op.m * op.h * (op.k + op.n))
    if isinstance(op, Attention):
        return upper(2 * max(upper(numel(op.batch)), 1) * op.m * op.s * (op.d + op.dv))
    if isinstance(op, Conv):
        n, m = op.out_shape[0], op.out_shape[1]
        return upper(2 * n * m * numel(op.out_shape[2:]) * op.w_shape[1] * numel(op.w_shape[2:]))
    return 0


# ----------------------------------------------------------------------------
# Loop: a general sequential fold per output element
#
#
# - `Loop`  a general sequential fold per output element:
#
#     accs = inits(o)
#     for k in 0 .. count-1:  accs = updates(o, k, accs)     (all updated at once)
#     out[o] = result(o, accs)
#
# Ops whose every output element is a fold over a known number of steps lower
# to it: cumulative sums and products, scatters (the updates in order, so
# duplicates and reductions are exact), ConvTranspose, Col2Im and DeformConv
# (the input positions that reach an output), RoiAlign's samples, DFT and
# STFT, Einsum, TopK's rank counting, MaxPool's argmax, MaxUnpool (each op's
# file in compiler/ops/ builds its steps; compiler/ops/loops.py emits the op).
# Expressions read tensors with `load(tensor, index)` like Generic's and use the
# vars `LOOP_K` and `acc_vars(...)`.

LOOP_K = kir.var("k", "i32")      # the step index inside a Loop's updates


def acc_vars(dtypes) -> list[Expr]:
    """The accumulators of a Loop with these element types (vars la0, la1, ...)."""
    return [kir.var(f"la{i}", dt) for i, dt in enumerate(dtypes)]


@dataclass
class Loop(Anchor):
    count: int = 0
    dtypes: list = field(default_factory=list)     # accumulator types
    inits: list = field(default_factory=list)      # Expr of o, one per accumulator
    updates: list = field(default_factory=list)    # Expr of o, LOOP_K and the accumulators
    result: Expr | None = None                     # Expr of o and the accumulators

    def inputs(self):
        return []

    def reads(self):
        out = []
        for e in list(self.inits) + list(self.updates) + [self.result, self.epilogue]:
            for r in _expr_reads(e):
                if r not in out:
                    out.append(r)
        return out
