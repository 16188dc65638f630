"""What a compilation target is: WebGPU limits, a device class and optional features.

One `Target` value is handed to the compiler (DESIGN.md), which never opens a device:

    Target.preset("default")   WebGPU's default limits: a build that runs on every adapter (with
                               no device class, a build carries both classes' kernels, picked at
                               load: bundler/site.py default_variants, docs/schedule-module.md VARS)
    Target.preset("gpu")       the same limits, kernels for GPU-class adapters
    Target.preset("cpu")       the same limits, kernels for CPU renderers (lavapipe, SwiftShader)
    Target.from_limits({...})  a dict of limits over the defaults (plus device_class, subgroup_size)
    Target.from_adapter(limits, adapter_type="CPU", subgroup_size=8, features=...)
                               what the caller read from an adapter (bundler.site does, through wgpu)

`as_limits()` is the flat dict the planner reads and the schedule module records. Standard
library only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import LimitsError

# WebGPU's default limits: what every adapter offers, so a site built with them runs anywhere.
DEFAULT_LIMITS = {
    "max_compute_invocations_per_workgroup": 256,
    "max_compute_workgroup_size_x": 256,
    "max_compute_workgroup_size_y": 256,
    "max_compute_workgroup_size_z": 64,
    "max_compute_workgroup_storage_size": 16384,
    "max_compute_workgroups_per_dimension": 65535,
    "max_storage_buffers_per_shader_stage": 8,
    "max_storage_buffer_binding_size": 134217728,
    "max_buffer_size": 268435456,
    "min_storage_buffer_offset_alignment": 256,
}
DEVICE_CLASSES = ("", "gpu", "cpu")        # "": not known, kernels chosen for any adapter
FEATURES = ("shader_f16", "timestamp_query", "packed_4x8_integer_dot_product")
PRESETS = ("default", "gpu", "cpu")
TIERS = ("", "start")          # "start": a kernel variant's start tier (compiler/driver.py variant_target)
U32_MAX = 0xFFFFFFFF


@dataclass(frozen=True)
class Target:
    limits: dict = field(default_factory=lambda: dict(DEFAULT_LIMITS))
    device_class: str = ""
    subgroup_size: int = 0       # a workgroup of this many invocations runs as exactly one subgroup
    features: frozenset = frozenset()
    tier: str = ""               # "start": the small kernels a page runs while the others compile

    def __post_init__(self):
        if self.device_class not in DEVICE_CLASSES:
            raise LimitsError(f"device_class must be one of {DEVICE_CLASSES[1:]}, not {self.device_class!r}")
        if self.tier not in TIERS:
            raise LimitsError(f"tier must be one of {TIERS[1:]}, not {self.tier!r}")
        unknown = sorted(set(self.features) - set(FEATURES))
        if unknown:
            raise LimitsError(f"unknown target features {unknown}", hint=f"known: {', '.join(FEATURES)}")

    @classmethod
    def preset(cls, name: str) -> "Target":
        if name not in PRESETS:
            raise LimitsError(f"no target preset {name!r}", hint=f"presets: {', '.join(PRESETS)}, or 'adapter'")
        return cls(device_class="" if name == "default" else name)

    @classmethod
    def from_limits(cls, limits: dict) -> "Target":
        """Limits over WebGPU's defaults; `device_class`, `subgroup_size` and feature names
        (True) may be given in the same dict. Limits above u32 are capped (the module records u32)."""
        if not isinstance(limits, dict):
            raise LimitsError(f"limits must be 'default', 'adapter', a preset ({', '.join(PRESETS[1:])}) or a dict "
                              f"of WebGPU limits, not {limits!r}")
        rest = dict(limits)
        device_class = rest.pop("device_class", "")
        subgroup_size = rest.pop("subgroup_size", 0)
        features = frozenset(k for k in FEATURES if rest.pop(k, False))
        for k, v in rest.items():
            if k in DEFAULT_LIMITS and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
                raise LimitsError(f"limit {k} must be a positive integer, not {v!r}")
        merged = dict(DEFAULT_LIMITS)
        merged.update({k: min(v, U32_MAX) if isinstance(v, int) else v for k, v in rest.items()})
        return cls(merged, device_class, subgroup_size, features)

    @classmethod
    def from_adapter(cls, limits: dict, adapter_type: str = "", subgroup_size: int = 0,
                     features=()) -> "Target":
        """The target of an adapter the caller has read: its limits (snake_case names), its type
        ('CPU' makes the device class cpu), the subgroup size it guarantees, its features."""
        lim = {k: limits[k] for k in DEFAULT_LIMITS if k in limits}
        lim["device_class"] = "cpu" if adapter_type.upper() == "CPU" else "gpu"
        if subgroup_size:
            lim["subgroup_size"] = subgroup_size
        lim.update({f: True for f in features if f in FEATURES})
        return cls.from_limits(lim)

    @classmethod
    def resolve(cls, target) -> "Target":
        """A Target from what users write: None or 'default', a preset name, a dict, or a Target."""
        if isinstance(target, Target):
            return target
        if target is None:
            return cls.preset("default")
        if isinstance(target, str):
            return cls.preset(target)
        return cls.from_limits(target)

    def as_limits(self) -> dict:
        """The flat dict the planner reads and the module records (only what is set)."""
        out = dict(self.limits)
        if self.device_class:
            out["device_class"] = self.device_class
        if self.subgroup_size:
            out["subgroup_size"] = self.subgroup_size
        out.update({f: True for f in sorted(self.features)})
        if self.tier:
            out["tier"] = self.tier
        return out
