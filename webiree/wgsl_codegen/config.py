"""The kernel planner: the one heuristic that chooses and sizes every dispatch's kernel.

Decided once here, recorded on the dispatch (and in the module, shown by `webiree
inspect`), and only read by the kernel builders (DESIGN.md contract 3; after
onnxruntime's WebGPU matmul planner). `TABLE` lists, per op kind and device class,
the strategies in order of preference; the first whose prerequisites hold
(`kernels.check`) and whose planner below accepts the problem sizes it. A tuning
table can later override the chosen `KernelConfig` by dispatch key. All sizes
respect the target's limits (invocations per workgroup, workgroup storage bytes,
workgroups per dimension).
"""

from __future__ import annotations

import dataclasses

from ..errors import CompilerBug, LimitsError
from ..ir.sym import Dim, typical
from ..ir import kir
from ..ir import program as P
from .kernels import check
from .kernels import attention, conv, matmul_chain
from .kernels.common import AttentionTile, ChainTile, ConvTile, DepthwiseTile, KernelConfig, MatmulTile, RowBlockTile
from .kernels.common import Strategy as S
from .kernels.matmul import matmul_nibbles_ok, matmul_vec4_ok

# Workgroups a dispatch should offer a discrete GPU before register blocks grow (about two
# per multiprocessor on a large GPU; WebGPU does not tell the multiprocessor count).
GPU_FILL_WORKGROUPS = 256


def _pow2_at_most(n: int, cap: int) -> int:
    p = 1
    while p * 2 <= min(n, cap):
        p *= 2
    return p


# ----------------------------------------------------------------------------
# one planner per strategy: (op, limits) -> its KernelConfig, or None where the sizes do not suit it

# Register blocks where the subgroup is 4 wide (SwiftShader, the browser's CPU renderer): at most
# 8 rows x 4 column slots. SwiftShader compiles every pipeline before a page's first result, and
# its compile time grows with the unrolled block (4 * S values of K x RM x RN): in Chromium,
# MobileNetV2's pipelines with 16 x 2 vec4 / 16 x 7 blocks took 28.1 s to create one by one and
# with these 11.6-15.8 s (two runs; MiniLM 13.7 s vs 4.1 s), for runs natively on SwiftShader
# 1.07x (MiniLM 1.19x) as long. A B computed where
# it is loaded (attention's K: bias, transposes, scale) is computed for each of 4 * S x RN
# values a step: 2 slots there (MiniLM's QK^T 0.66 s instead of 1.77 s, runs 1.01x as long).
# lavapipe (S = 8) keeps the larger blocks: its runs were 1.19-1.30x as long with these
# (docs/performance.md).
SMALL_SUBGROUP_ROWS, SMALL_SUBGROUP_COLS = 8, 4

# The start tier (a variant named '...-start', limits["tier"] == "start"): the blocks of a variant
# that a page runs only while its own variant's pipelines compile (webiree.js), so chosen for compile
# time alone: at most 4 rows x 1 column slot a matmul invocation, 4 outputs a row-block convolution.
# Natively on Chromium's SwiftShader (wgpu-py, pipelines created one by one), MobileNetV2's cpu-sg4
# pipelines took 12.1 s to create, its start tier's 2.3 s, for runs of 421-535 ms instead of 336-399
# (4 x 1 blocks; 1 x 1 compiled in 1.9 s and ran 950-1,310 ms; docs/performance.md).
START_ROWS, START_COLS, START_ROW_WIDTH = 4, 1, 4


def _start_tier(limits: dict) -> bool:
    return limits.get("tier") == "start"


def _subgroup_broadcast(op: P.MatMul, limits: dict):
    # one subgroup per workgroup; each invocation's vec4 of A serves 4*S values of K to all.
    # RM x RN slots of accumulators (128 floats either way) per invocation.
    S_ = limits["subgroup_size"]
    vec = 4 if matmul_vec4_ok(op) or matmul_nibbles_ok(op) else 1
    slots = op.n // vec
    rn = max(1, min(2 if vec == 4 else 8, -(-slots // S_)))
    rm = max(1, min(16, op.m))
    if S_ <= 4:     # see SMALL_SUBGROUP_ROWS
        rm, rn = min(rm, SMALL_SUBGROUP_ROWS), min(rn, 2 if _costly_b(op) else SMALL_SUBGROUP_COLS)
    if _start_tier(limits):
        rm, rn = min(rm, START_ROWS), min(rn, START_COLS)
    groups = lambda: -(-slots // (S_ * rn)) * -(-op.m // rm) * max(1, P.numel(op.batch))  # noqa: E731
    while groups() < 4 and rm > 1:
        rm = max(1, rm // 2)
    if -(-op.k // (4 * S_)) > SERIAL_LOOP_ITERATIONS:
        return None     # one invocation would loop past llvmpipe's limit: split K instead
    return KernelConfig((S_, 1, 1), MatmulTile(rm, rn, 4 * S_), vec, S.SUBGROUP_BROADCAST)


COSTLY_PROLOGUE = 6     # kernel-IR operations: a B operand computed this expensively is worth reusing


def _costly_b(op: P.MatMul) -> bool:
    """Whether B is computed where it is loaded at some cost (a 4-bit or int8 weight's dequantization)."""
    return op.b in op.prologues and kir.cost(op.prologues[op.b]) > COSTLY_PROLOGUE


def _register_blocked(op: P.MatMul, limits: dict):
    # CPU adapters (lavapipe, SwiftShader) run a workgroup as SIMD loops over invocations:
    # barriers are expensive and caches make workgroup memory pointless. One SIMD-wide
    # workgroup whose invocations each own a large register block (up to 16 rows x 12 vec4
    # columns) streams B fewer times (docs/performance.md has the measurements).
    vec = 4 if matmul_vec4_ok(op) else 1
    cols = -(-op.n // vec)
    wx = 8
    rn = max(1, min(12 if vec == 4 else 16, -(-cols // wx)))
    rm = max(1, min(16, op.m))
    groups = lambda: -(-cols // (wx * rn)) * -(-op.m // rm) * max(1, P.numel(op.batch))  # noqa: E731
    if _costly_b(op):   # each B value (dequantized where it is loaded) serves every row of the block
        rn = max(1, min(rn, 48 // rm))
    while rm * rn > 48 and rm > 4:     # keep shaders small: LLVM compile time grows fast
        rm //= 2
    if _start_tier(limits):
        rm, rn = min(rm, START_ROWS), min(rn, START_COLS)
    while groups() < 4 and rm > 1:
        rm = max(1, rm // 2)
    if -(-op.k // 4) > SERIAL_LOOP_ITERATIONS:
        return None     # one invocation would loop past llvmpipe's limit: split K instead
    return KernelConfig((wx, 1, 1), MatmulTile(rm, rn, 4 if op.k >= 4 else 1), vec, S.REGISTER_BLOCKED)


# A K shorter than 256 that is split across slices too (f32 products): on the H200 every product of
# K = 128 with at most 65,536 outputs the tables hold ran faster split (8 x 8 x 4, K steps of 16) than
# in tiled-shared 16 x 16 tiles: MobileBERT's 128 x 128 / 256 / 512 products 0.71x / 0.70x / 0.85x, its
# attention x V (4 heads of 128 x 32) 0.72x, MiniLM's (12 heads) 0.85x and the int8 MiniLM's 0.55x
# (benchmarks/tuning/h200-mobilebert.json, h200-minilm.json, h200-minilm_int8.json). K between 128 and
# 256 is in no table (MobileNetV2's 1x1 convolutions of K = 144-192 keep their tiles until one measures
# them), nor an integer product shorter than 256.
SPLIT_K_SHORT = 128


def _split_k(op: P.MatMul, limits: dict):
    # a small output with a long K (BERT's 128 x 512 x 128) makes too few output tiles to fill a
    # GPU: split K over 4 slices of 8 x 8 invocations (faster on the H200 per
    # benchmarks/matmul_variants.py).
    if (op.k >= 256 or (op.k == SPLIT_K_SHORT and not op.int8)) and op.m * op.n <= 65536:
        return KernelConfig((8, 8, 4), MatmulTile(1, 1, INT8_K_STEP if op.int8 else 16), 1, S.SPLIT_K)
    return None


# An integer product moves words of 4 values of K (kernels/matmul_int8.py): its K steps are 32 values,
# 8 words; on the H200 quantize_dynamic MiniLM's products took 0.67-0.75x the GPU time of steps of 16
# and tiled-shared 2 x 2 blocks 0.50x of 1 x 1 (benchmarks/tuning/h200-minilm_int8.json).
INT8_K_STEP = 32


def _tiled_shared_vec4(op: P.MatMul, limits: dict):
    # vec4 tiles in workgroup memory: RM rows x RN vec4 columns per invocation, the largest
    # block that still offers the GPU enough workgroups, K steps of 16 where they fit.
    # A product too small to fill the GPU even with 1 x 1 blocks (BERT's 128 x 128 x 512)
    # takes the scalar tiles instead, whose 16 x 16 tiles make 4x more workgroups (faster end
    # to end on MobileBERT, although one dispatch alone favours vec4 tiles).
    batch = max(1, P.numel(op.batch))
    n4 = -(-op.n // 4)
    groups = lambda rm, rn: -(-op.m // (16 * rm)) * -(-n4 // (16 * rn)) * batch  # noqa: E731
    if groups(1, 1) < GPU_FILL_WORKGROUPS // 2:
        return None
    rm, rn = next(((rm, rn) for rm, rn in ((8, 2), (4, 2), (4, 1), (2, 1))
                   if groups(rm, rn) >= GPU_FILL_WORKGROUPS), (1, 1))
    for bk in (16, 8):
        if 4 * bk * 16 * (rm + 4 * rn) <= limits["max_compute_workgroup_storage_size"]:
            return KernelConfig((16, 16, 1), MatmulTile(rm, rn, bk), 4, S.TILED_SHARED_VEC4)
    return None


def _tiled_shared(op: P.MatMul, limits: dict):
    # 16x16 threads, each an RM x RN register block, K in steps of TK. The block is the
    # largest that still gives the GPU enough workgroups to fill it (a small product such
    # as BERT's 128x384 makes only 12 workgroups with 64x64 tiles).
    inv = limits["max_compute_invocations_per_workgroup"]
    wx = min(16, limits["max_compute_workgroup_size_x"])
    wy = max(1, min(16, inv // wx, limits["max_compute_workgroup_size_y"]))
    batch = max(1, P.numel(op.batch))
    rm = rn = 1
    # at most 4 x 4 an invocation: 8 x 8 blocks were the slowest choice on every wide product the
    # H200's table holds (DeepLabV3's, 1.1-2.4x slower than 4 x 4 or smaller: benchmarks/tuning/h200-deeplabv3.json)
    fill = GPU_FILL_WORKGROUPS // 2 if op.int8 else GPU_FILL_WORKGROUPS
    for r in (4, 2):
        if -(-op.m // (wy * r)) * -(-op.n // (wx * r)) * batch >= fill:
            rm = rn = r
            break
    if op.m < wy:
        rm = 1
    tk = INT8_K_STEP if op.int8 else 8 if rm * rn >= 64 else 16
    shared = 4 * tk * (wy * rm + wx * rn)
    while shared > limits["max_compute_workgroup_storage_size"] and tk > 1:
        tk //= 2
        shared = 4 * tk * (wy * rm + wx * rn)
    return KernelConfig((wx, wy, 1), MatmulTile(rm, rn, tk), 1, S.TILED_SHARED)


def _row_block(op: P.Conv, limits: dict):
    # CPU adapters, small windows (depthwise 3x3, the stem): 8 outputs of a row per invocation, 128
    # invocations, so each input of the window's rows is loaded once for 8 outputs (1.3-1.8x the 4 on
    # 64 of before on lavapipe, on 12 of MobileNetV2's 13 convolutions: benchmarks/tuning/lavapipe-mobilenet_v2.json)
    # GPUs, depthwise convolutions: 2 outputs a row per invocation (4 where dilated), 128 invocations:
    # the H200's fastest candidate on 16 of the 18 depthwise shapes of MobileNetV2 and DeepLabV3 and
    # within 1.1 % on the other two, 1.03-1.56x faster than the direct kernel, which loads every input
    # once for each output whose window holds it (held-clock tables: benchmarks/tuning/h200-mobilenet_v2.json,
    # h200-deeplabv3-held.json; their depthwise GPU time 0.125 -> 0.110 and 0.442 -> 0.299 ms)
    if op.out_shape[3] < 4 or op.w_shape[1] * op.w_shape[2] * op.w_shape[3] > 64:
        return None
    wg = min(128, limits["max_compute_invocations_per_workgroup"], limits["max_compute_workgroup_size_x"])
    if limits.get("device_class") != "cpu":
        if op.w_shape[1] != 1:
            return None        # the stem (3 input channels): the direct kernel's 4 output channels
        return KernelConfig((wg, 1, 1), RowBlockTile(1, 2 if op.dilations == (1, 1) else 4), 1, S.ROW_BLOCK)
    return KernelConfig((wg, 1, 1), RowBlockTile(1, START_ROW_WIDTH if _start_tier(limits) else 8), 1,
                        S.ROW_BLOCK)


def _spread(n: int, most: int) -> int:
    """Invocations along a dimension of n slots, at most `most`, as few as cover n in the same
    number of workgroups (65 columns in 2 tiles of 33, not 64 + 1)."""
    return -(-n // -(-n // most))


def depthwise_shared(op: P.Conv, limits: dict) -> KernelConfig | None:
    """The first depthwise-shared tile `webiree tune` times (no default chooses the kernel: not yet
    measured on a GPU): 2 x 2 outputs an invocation (1 along a dimension below 8 outputs), up to
    16 invocations along a row and 128 in all, tiles as even as the output allows."""
    oh, ow = op.out_shape[2:]
    rows, width = (2 if oh >= 8 else 1), (2 if ow >= 8 else 1)
    inv = min(128, limits["max_compute_invocations_per_workgroup"])
    tx = _spread(-(-ow // width), min(16, limits["max_compute_workgroup_size_x"]))
    ty = _spread(-(-oh // rows), min(max(1, inv // tx), limits["max_compute_workgroup_size_y"]))
    while True:
        cfg = KernelConfig((tx, ty, 1), DepthwiseTile(rows, width), 1, S.DEPTHWISE_SHARED)
        if conv.check(cfg.strategy, op, limits, cfg) is None:
            return cfg
        if ty == 1:
            return None
        ty = -(-ty // 2)


def _direct(op: P.Conv, limits: dict):
    cout_per_group = op.w_shape[0] // op.group
    cb = 4 if cout_per_group % 4 == 0 else (2 if cout_per_group % 2 == 0 else 1)
    return KernelConfig((min(64, limits["max_compute_invocations_per_workgroup"]), 1, 1), ConvTile(cb), 1,
                        S.DIRECT)


# Loop iterations one invocation may run, all its loops together: llvmpipe (lavapipe, and Dawn's
# OpenGL ES backend over it) ends every loop of an invocation once 65,535 back-edges have been
# taken in all (gallivm's loop limiter, LP_MAX_TGSI_LOOP_ITERATIONS), silently, so a kernel past
# it computes wrong values. Row kernels pass over a row up to _row_passes times.
SERIAL_LOOP_ITERATIONS = 65535


def _row_passes(op) -> int:
    """How often a row kernel loops over its row: softmax max, sum, write; layernorm up to three;
    a reduction once (logsumexp twice: max, then the sum)."""
    if isinstance(op, P.Reduce):
        return 2 if op.mode == "logsumexp" else 1
    return 3


def _row_per_invocation(op, limits: dict):
    # one row per invocation of a SIMD-wide workgroup: no barriers (a coroutine switch on lavapipe);
    # a row too long for one invocation's loops goes to the workgroup tree
    if _row_passes(op) * op.r > SERIAL_LOOP_ITERATIONS:
        return None
    return KernelConfig((8, 1, 1), (), 1, S.ROW_PER_INVOCATION)


def _workgroup_tree(op, limits: dict):
    # 64 invocations a row on CPU adapters, more where each would otherwise loop past
    # SERIAL_LOOP_ITERATIONS. GPUs: 256 for rows of 256 or more, 128 below (on the H200 DeepLabV3's mean
    # over 4,225 values 2.4x faster than with 64; MiniLM's layernorms over 384 0.34x the time of 64,
    # its softmax rows of 128 0.51x, its quantized activations' ranges 0.27-0.54x:
    # benchmarks/tuning/h200-deeplabv3.json, h200-minilm_int8.json)
    inv = limits["max_compute_invocations_per_workgroup"]
    want = 64 if limits.get("device_class") == "cpu" else 256 if op.r >= 256 else 128
    while want < inv and _row_passes(op) * -(-op.r // want) > SERIAL_LOOP_ITERATIONS:
        want *= 2
    passes = _row_passes(op)
    if passes * -(-op.r // min(want, inv)) > SERIAL_LOOP_ITERATIONS:
        most = min(want, inv) * (SERIAL_LOOP_ITERATIONS // passes)
        raise LimitsError(f"{op.name} reduces rows of {op.r:,} elements; webiree's one-dispatch reductions take at "
                          f"most {most:,} ({min(want, inv)} invocations of at most {SERIAL_LOOP_ITERATIONS:,} loop "
                          f"iterations each, llvmpipe's limit)", hint="reduce in steps (reshape the row and reduce twice)")
    return KernelConfig((_pow2_at_most(max(op.r, 1), min(want, inv)), 1, 1), (), 1, S.WORKGROUP_TREE)


def _serial_loop(op) -> int:
    """Iterations of the loop one invocation of a one-per-output kernel runs: a pooling window, a
    Loop op's count (0: none)."""
    if isinstance(op, P.Pool):
        return P.numel(op.kernel)
    return int(getattr(op, "count", 0) or 0)


def _one_per_output(strategy):
    def plan(op, limits):
        n = _serial_loop(op)
        if n > SERIAL_LOOP_ITERATIONS:
            raise LimitsError(f"{op.name} loops over {n:,} elements for each output; one invocation may loop "
                              f"at most {SERIAL_LOOP_ITERATIONS:,} times (llvmpipe's limit: past it, results are "
                              "silently wrong)", hint="use a smaller window, or a global pool over the whole input")
        return KernelConfig((min(64, limits["max_compute_invocations_per_workgroup"]), 1, 1), (), 1, strategy)
    return plan


PARTIAL_WORDS = 2      # words an invocation of a GPU's range-pack packs where x's producer reduced the range


def _range_pack(op, limits: dict):
    # every workgroup reduces all of x, then packs `words` words per invocation: a GPU runs 16
    # workgroups of as many invocations as it allows (up to 1,024: each re-reads x from L2: one
    # compute unit's bandwidth from L2 sets the time, docs/performance.md), a CPU renderer 4 (the whole reduction per core)
    from .kernels.matmul_int8 import range_unroll
    inv = limits["max_compute_invocations_per_workgroup"]
    cpu = limits.get("device_class") == "cpu"
    groups, n4 = (4 if cpu else 16), op.n // 4
    wg = _pow2_at_most(inv, 64 if cpu else 1024)
    if op.partials and not cpu:     # the range comes reduced per producing workgroup: a GPU spreads the
        wg = _pow2_at_most(inv, 256)    # packing wide, PARTIAL_WORDS words an invocation
        groups = max(1, -(-n4 // (wg * PARTIAL_WORDS)))
    while True:
        words = max(1, -(-n4 // (wg * groups)))
        if -(-n4 // (wg * range_unroll(limits))) + words <= SERIAL_LOOP_ITERATIONS:
            return KernelConfig((wg, 1, 1), (words,), 1, S.RANGE_PACK)
        if wg * 2 > inv:
            raise LimitsError(f"{op.name} quantizes {op.n:,} values in one dispatch: past {wg} invocations' "
                              f"{SERIAL_LOOP_ITERATIONS:,} loop iterations (llvmpipe's limit)")
        wg *= 2


def _chain_subgroup(op: P.MatMulChain, limits: dict):
    # CPU adapters with subgroups: the workgroup is the subgroup, A (then the intermediate) broadcast
    # from it, up to 16 rows a workgroup x 1 vec4 slot an invocation (as the subgroup-broadcast
    # product's best blocks on lavapipe: each loaded vec4 of B serves every row), fewer rows where
    # the model offers fewer than 4 workgroups, and as many as workgroup memory holds whole rows of
    # the intermediate for (MobileBERT's: 8 rows in 16 KiB, 16 in 32); in parts of H only where not
    # one row fits. On lavapipe MobileBERT's feed-forward block alone (128 x 128 x 512 x 128, host to
    # host, median of 40 in turns) took 2.20 ms with 8 rows against 2.47 ms with 16 in 4 parts (the
    # parts' partial sums go through workgroup memory).
    # Start tier: START_ROWS x START_COLS.
    sg = limits["subgroup_size"]
    rows = [r for r in (16, 8, 4, 2) if -(-op.m // r) >= 4] + [1]
    rn = 1
    if _start_tier(limits):
        rows, rn = [r for r in rows if r <= START_ROWS], START_COLS
    elif sg <= 4:
        rows = [r for r in rows if r <= SMALL_SUBGROUP_ROWS]
    for parts in (1, 2, 4, 8):
        for r in rows:
            cfg = KernelConfig((sg, 1, 1), ChainTile(r, rn, 1, 1, parts), 4, S.CHAIN_SUBGROUP)
            steps = -(-op.h // 4 // parts // (sg * rn)) * -(-op.k // (4 * sg)) + \
                -(-op.n // 4 // (sg * rn)) * -(-op.h // parts // (4 * sg))
            if matmul_chain.check(cfg.strategy, op, limits, cfg) is None and parts * (steps + 2) <= SERIAL_LOOP_ITERATIONS:
                return cfg
    return None


def _chain_shared(op: P.MatMulChain, limits: dict):
    # GPUs: 128 invocations, 2 rows of A a workgroup (MobileBERT's 128-row products: 64
    # workgroups, each reading B1 and B2 once), the second product's H split over as many slices
    # as leave one vec4 of N per invocation, loops stepping 4 vec4s. On the H200 MobileBERT's 96
    # chains took 1.785 ms this way, the tuning table's best (256 invocations, 8 slices) 1.755 ms
    # (benchmarks/tuning/h200-mobilebert.json); 2 rows 0.92x the time of 4, 0.66x that of 1.
    # CPU adapters without subgroups: 8 invocations, 2 slots each of up to 8 rows, fewer where
    # workgroup memory or the workgroup count (at least 4) asks. The first configuration the
    # limits allow; 1 row, 1 slot last.
    inv = min(limits["max_compute_invocations_per_workgroup"], limits["max_compute_workgroup_size_x"])
    n4, h4, k4 = op.n // 4, op.h // 4, op.k // 4

    def unroll(z):
        return next(u for u in (4, 2, 1) if k4 % u == 0 and (h4 // z) % u == 0)
    if limits.get("device_class") == "cpu":
        rows = [r for r in (8, 4, 2) if -(-op.m // r) >= 4] + [1]
        if _start_tier(limits):
            rows = [r for r in rows if r <= START_ROWS]
        tries = [((8, 1, 1), ChainTile(r, 1 if _start_tier(limits) else 2, 1, 1)) for r in rows]
    else:
        t = _pow2_at_most(128, inv)
        z = next((z for z in (8, 4, 2) if t % z == 0 and h4 % z == 0 and (t // z) >= n4), 1)
        tries = [((t, 1, 1), ChainTile(r, 1, z, unroll(z))) for r in (2, 1)] + [((t, 1, 1), ChainTile(1, 1, 1, unroll(1)))]
    tries.append(((_pow2_at_most(64, inv), 1, 1), ChainTile(1, 1, 1, 1)))
    for wg, tile in tries:
        cfg = KernelConfig(wg, tile, 4, S.CHAIN_SHARED)
        chunks = -(-h4 // (wg[0] * tile.cols)) * k4 + -(-n4 // (wg[0] // tile.slices * tile.cols)) * (h4 // tile.slices)
        if matmul_chain.check(cfg.strategy, op, limits, cfg) is None and chunks <= SERIAL_LOOP_ITERATIONS:
            return cfg
    raise LimitsError(f"{op.name}: no chained-product kernel fits this adapter's limits")


def _attention_online(op: P.Attention, limits: dict):
    # GPUs: 64 invocations, 8 rows, each row's keys split over 8 invocations, 4 keys a split a
    # block (32 a block). On the H200 (`webiree tune`, MiniLM's heads alone: 12 x 128 x 32, keys
    # 128) 13.3 us, the best of 125 candidates 13.2; without splits (32 rows, 32 keys) 33 us: 1,536
    # invocations each running over all 128 keys leave the GPU mostly idle. CPU adapters without subgroups (the `cpu` variant of a build for every adapter class;
    # a CPU-class target without subgroups does not fuse attention: compiler/passes.py
    # fuse_attention): 64 rows, 16 keys, the fastest of those tried on lavapipe in MiniLM (176 ms
    # a run; 8 rows 192 ms, 32 rows x 8 keys 186, 128 rows 193; the three dispatches 144). Fewer
    # keys where workgroup memory asks; on a GPU then 32 and 16 invocations (4 and 2 rows: the
    # splits' sums of 64 invocations' rows of 64 values, BERT-base's heads, need 17 KiB of workgroup
    # memory, past the default 16), then rows without splits (no sums to meet: heads up to
    # ATTENTION_HEAD_MAX).
    inv = min(limits["max_compute_invocations_per_workgroup"], limits["max_compute_workgroup_size_x"])
    cpu = limits.get("device_class") == "cpu"
    t = _pow2_at_most(64, inv)
    shapes = [(t, 1, (16, 8, 4, 2, 1))] if cpu else \
        [(t, 8, (4, 2, 1)), (t // 2, 8, (4, 2, 1)), (t // 4, 8, (4, 2, 1)), (t, 1, (4, 2, 1))]
    for wg, z, tries in shapes:
        for keys in tries:
            cfg = KernelConfig((wg, 1, 1), AttentionTile(keys, z if wg % z == 0 else 1), 1, S.ATTENTION_ONLINE)
            if attention.check(cfg.strategy, op, limits, cfg) is None:
                return cfg
    raise LimitsError(f"{op.name}: no fused-attention kernel fits this adapter's limits")


def _attention_subgroup(op: P.Attention, limits: dict):
    # CPU adapters with subgroups: a row a lane, keys 4 at a time (on lavapipe MiniLM's heads alone
    # took 3.6 ms host to host, 8 keys 4.7, the three dispatches 7.5; GPU time 1.62 against 4.2 ms).
    return KernelConfig((limits["subgroup_size"], 1, 1), AttentionTile(4), 1, S.ATTENTION_SUBGROUP)


PLANNERS = {
    S.SUBGROUP_BROADCAST: _subgroup_broadcast, S.REGISTER_BLOCKED: _register_blocked, S.SPLIT_K: _split_k,
    S.TILED_SHARED_VEC4: _tiled_shared_vec4, S.TILED_SHARED: _tiled_shared, S.ROW_BLOCK: _row_block,
    S.DIRECT: _direct, S.ROW_PER_INVOCATION: _row_per_invocation, S.WORKGROUP_TREE: _workgroup_tree,
    S.WINDOW: _one_per_output(S.WINDOW), S.ELEMENTWISE: _one_per_output(S.ELEMENTWISE),
    S.RANGE_PACK: _range_pack, S.CHAIN_SHARED: _chain_shared, S.CHAIN_SUBGROUP: _chain_subgroup,
    S.ATTENTION_ONLINE: _attention_online, S.ATTENTION_SUBGROUP: _attention_subgroup,
}

# op kind -> device class -> strategies, most preferred first. An adapter of unknown class
# (the default target) gets the GPU kernels.
_ROWS = {"cpu": (S.ROW_PER_INVOCATION, S.WORKGROUP_TREE), "gpu": (S.WORKGROUP_TREE,)}
TABLE = {
    P.MatMul: {"cpu": (S.SUBGROUP_BROADCAST, S.REGISTER_BLOCKED, S.SPLIT_K, S.TILED_SHARED),
               "gpu": (S.SPLIT_K, S.TILED_SHARED_VEC4, S.TILED_SHARED)},
    P.Conv: {"cpu": (S.ROW_BLOCK, S.DIRECT), "gpu": (S.ROW_BLOCK, S.DIRECT)},
    P.Softmax: _ROWS,
    P.LayerNorm: _ROWS,
    P.Reduce: {"cpu": (S.WORKGROUP_TREE,), "gpu": (S.WORKGROUP_TREE,)},
    P.Pool: {"cpu": (S.WINDOW,), "gpu": (S.WINDOW,)},
    P.Generic: {"cpu": (S.ELEMENTWISE,), "gpu": (S.ELEMENTWISE,)},
    P.Loop: {"cpu": (S.ELEMENTWISE,), "gpu": (S.ELEMENTWISE,)},
    P.QuantizeWords: {"cpu": (S.RANGE_PACK,), "gpu": (S.RANGE_PACK,)},
    P.MatMulChain: {"cpu": (S.CHAIN_SUBGROUP, S.CHAIN_SHARED), "gpu": (S.CHAIN_SHARED,)},
    P.Attention: {"cpu": (S.ATTENTION_SUBGROUP, S.ATTENTION_ONLINE), "gpu": (S.ATTENTION_ONLINE,)},
}


def _planned_size(d):
    """A symbolic size as the planner sees it: its value at the symbols' `opt` sizes (ir/sym.py)."""
    return d if not isinstance(d, Dim) else max(typical(d), 1)


def planning_view(op: P.Op) -> P.Op:
    """The op with its symbolic sizes replaced for planning (the op itself when it has none).
    Kernels are planned for the symbols' typical (`opt`) sizes; memory for the largest."""
    changes = {}
    for f in dataclasses.fields(op):
        v = getattr(op, f.name)
        if isinstance(v, Dim):
            changes[f.name] = _planned_size(v)
        elif isinstance(v, tuple) and any(isinstance(x, Dim) for x in v):
            changes[f.name] = tuple(_planned_size(x) for x in v)
    if not changes:
        return op
    view = dataclasses.replace(op, **changes)
    view.symbolic = frozenset(changes)      # which sizes vary (a planner may want to know)
    # sizes not known to be multiples of 4 in every run: no vec4 rows along them (kernels.matmul)
    view.unaligned = frozenset(f.name for f in dataclasses.fields(op) if isinstance(getattr(op, f.name), Dim)
                               and (isinstance(getattr(op, f.name) % 4, Dim) or getattr(op, f.name) % 4))
    return view


def _aligned_variant(view: P.Op, cfg: KernelConfig, limits: dict) -> KernelConfig | None:
    """For a product whose symbolic N keeps it off vec4 rows: the register-blocked vec4 plan for
    the runs where N is a multiple of 4 (most image sizes), built beside the scalar one."""
    if not (isinstance(view, P.MatMul) and "n" in getattr(view, "symbolic", ()) and cfg.vector == 1
            and cfg.strategy == S.REGISTER_BLOCKED):
        return None
    even = dataclasses.replace(view, n=max(view.n - view.n % 4, 4))
    even.unaligned = view.unaligned - {"n"}
    if not matmul_vec4_ok(even):
        return None
    alt = _register_blocked(even, limits)
    return alt if alt.vector == 4 and alt.workgroup_size == cfg.workgroup_size else None


def choose(op: P.Op, prog: P.Program, limits: dict) -> KernelConfig:
    cfg = _choose(planning_view(op), limits)
    if op is not planning_view(op):
        cfg.aligned = _aligned_variant(planning_view(op), cfg, limits)
    return cfg


def _choose(op: P.Op, limits: dict) -> KernelConfig:
    device_class = "cpu" if limits.get("device_class") == "cpu" else "gpu"
    for strategy in TABLE[type(op)][device_class]:
        if check(strategy, op, limits) is None:
            cfg = PLANNERS[strategy](op, limits)
            if cfg is not None:
                return cfg
    raise CompilerBug(f"no kernel strategy of {TABLE[type(op)][device_class]} takes {op.name}",
                      hint="the planner's table lacks a fallback; please report this")
