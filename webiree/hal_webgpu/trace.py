"""A profiled run as a Chrome trace (Trace Event Format; Perfetto and chrome://tracing open it).

One complete event per dispatch, placed at its GPU timestamps (begin and end of its compute
pass), named after the dispatch and carrying the ONNX nodes it fused and its kernel strategy.
webiree.js builds the same JSON (`results.trace` of a profiled run). Pure Python.
"""

from __future__ import annotations


def chrome_trace(dispatches: list, spans: list, model: str = "") -> dict:
    """dispatches: the module's `info["dispatches"]` (name, kind, nodes, config); spans:
    [(begin_ns, end_ns)] per dispatch, from the GPU's timestamp queries."""
    t0 = min((b for b, _ in spans), default=0)
    events = [{"name": "process_name", "ph": "M", "pid": 1, "tid": 1,
               "args": {"name": f"webiree {model} (GPU)".replace("  ", " ")}}]
    for i, (begin, end) in enumerate(spans):
        d = dispatches[i] if i < len(dispatches) else {}
        events.append({"name": d.get("name", f"dispatch {i}"), "cat": d.get("kind", "dispatch"), "ph": "X",
                       "pid": 1, "tid": 1, "ts": (begin - t0) / 1000, "dur": max(end - begin, 0) / 1000,
                       "args": {"index": i, "nodes": list(d.get("nodes", [])),
                                "strategy": d.get("config", {}).get("strategy", "")}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}
