"""Code generation: kernel IR (kir), the configuration heuristic, kernel builders, WGSL renderer."""
