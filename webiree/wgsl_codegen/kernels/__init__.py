"""Kernel builders by family: one canonical op + its KernelConfig -> a kernel-IR Kernel.

Each family module holds the builders of its op kinds; they only read the
configuration chosen by the planner (`config.py`) and never pick sizes
themselves. The result is target-neutral kernel IR (ir/kir.py), rendered to
WGSL by wgsl.py and to SPIR-V by spirv.py.

| family          | op kinds             | module          |
|-----------------|----------------------|-----------------|
| elementwise     | Generic              | elementwise.py  |
| matmul          | MatMul               | matmul.py       |
| chained products | MatMulChain         | matmul_chain.py |
| fused attention | Attention            | attention.py    |
| int8 products   | MatMul (int8), QuantizeWords | matmul_int8.py |
| convolution     | Conv                 | conv.py         |
| pool / reduce   | Pool, Reduce         | pool_reduce.py  |
| norm / softmax  | Softmax, LayerNorm   | norm_softmax.py |
| loop            | Loop                 | loop.py         |

The kernel that writes a DynamicQuantizeLinear's input also records its range where the program
says so (Tensor.ranges): quant_range.py rewrites whichever builder's kernel that is.
"""

from __future__ import annotations

from ...errors import LimitsError
from ...ir import kir
from ...ir import program as P
from ...errors import CompilerBug
from . import attention, conv, matmul, matmul_chain, matmul_int8, quant_range
from .attention import build_attention
from .common import Binder, Dispatch, KernelConfig, Strategy, arrays_bytes, grid_for
from .conv import build_conv
from .elementwise import build_generic
from .loop import build_loop
from .matmul import build_matmul
from .matmul_chain import build_matmul_chain
from .matmul_int8 import build_quantize_words
from .norm_softmax import build_layernorm, build_softmax
from .pool_reduce import build_pool, build_reduce

# canonical op class -> builder(op, prog, cfg, limits, binder) -> (body, shared arrays, grid)
BUILDERS = {
    P.Generic: build_generic, P.MatMul: build_matmul, P.Conv: build_conv, P.Pool: build_pool,
    P.Reduce: build_reduce, P.Softmax: build_softmax, P.LayerNorm: build_layernorm, P.Loop: build_loop,
    P.QuantizeWords: build_quantize_words, P.MatMulChain: build_matmul_chain, P.Attention: build_attention,
}


def check(strategy: Strategy, op: P.Op, limits: dict, cfg: KernelConfig | None = None) -> str | None:
    """Why `strategy` cannot build `op` on a target with these limits (None: it can); where the
    answer depends on the sizes (a chain's workgroup memory), also why `cfg` cannot."""
    if isinstance(op, P.MatMulChain):
        return matmul_chain.check(strategy, op, limits, cfg)
    if isinstance(op, P.Attention):
        return attention.check(strategy, op, limits, cfg)
    if isinstance(op, P.MatMul):
        return matmul.check(strategy, op, limits)
    if isinstance(op, P.Conv):
        return conv.check(strategy, op, limits, cfg)
    return None


def build(op: P.Op, prog: P.Program, cfg: KernelConfig, limits: dict) -> Dispatch:
    why = check(cfg.strategy, op, limits, cfg)
    if why:
        raise CompilerBug(f"dispatch {op.name}: the {cfg.strategy.value} kernel {why}",
                          hint="a tuning table or forced configuration chose a strategy this op cannot use")
    builder = BUILDERS[type(op)]
    b = Binder(prog, getattr(op, "prologues", None))
    body, shared, grid = builder(op, prog, cfg, limits, b)
    if prog.tensors[prog.root(op.out)].ranges:     # a DynamicQuantizeLinear's range, reduced where it is written
        body, shared = quant_range.record(op, prog, b, body, shared, grid, cfg.workgroup_size, limits)
    body = b.bind_dims(body)
    bindings = b.bindings(op.out)
    body = kir.hoist_invariants(body, {bd.name for bd in bindings if bd.writes})
    kernel = kir.Kernel(op.name, bindings, cfg.workgroup_size, body, shared)
    storage = [bd for bd in kernel.bindings if not bd.uniform]    # the dims buffer is a uniform one
    if len(storage) > limits["max_storage_buffers_per_shader_stage"]:
        raise LimitsError(f"dispatch {op.name} needs {len(storage)} storage buffers, above the limit of "
                          f"{limits['max_storage_buffers_per_shader_stage']}")
    return Dispatch(op.name, op.kind, list(op.nodes), kernel, cfg, grid, b.tensors)


__all__ = ["BUILDERS", "Dispatch", "KernelConfig", "Strategy", "arrays_bytes", "build", "check", "grid_for"]
