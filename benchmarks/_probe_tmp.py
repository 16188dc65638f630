import sys, statistics, time, numpy as np
sys.path.insert(0, "benchmarks")
from pathlib import Path
from dynamic_shapes import export
from webiree.compiler.driver import compile_model
from webiree.session import InferenceSession
from webiree.bundler.site import resolve_target
p = Path("/tmp/minilm.onnx"); export("minilm", p)
feeds = {n: np.ones((1, 128), np.int64) for n in ("input_ids", "attention_mask", "token_type_ids")}
cfgs = {"pinned": {"batch": 1, "sequence": 128}, "dyn-narrow": {"batch": (1, 1), "sequence": (1, 128, 128)},
        "dyn-b1": {"batch": 1, "sequence": (1, 512, 128)}, "dyn-full": {"batch": (1, 4), "sequence": (1, 512)}}
S = {}
for k, d in cfgs.items():
    r = compile_model(str(p), dims=d, target=resolve_target("adapter"))
    S[k] = InferenceSession.from_module(r.module, r.weights)
    print(k, "arena", r.plan.arena_peak, "symbols", r.module.symbols)
T = {k: [] for k in S}; G = {k: [] for k in S}
for i in range(25):
    for k, s in S.items():
        t = time.perf_counter(); s.run(None, feeds); T[k].append(time.perf_counter() - t)
        s.run(None, feeds, profile=True); G[k].append(sum(s.last_profile) / 1e6)
for k in S: print(k, "wall %.2f ms" % (statistics.median(T[k]) * 1e3), "gpu %.3f ms" % statistics.median(G[k]))
