"""A module's requirements against an adapter: the runtime core's one check (pure Python)."""

from __future__ import annotations

from ..errors import LimitsError

PACKED_4X8 = "packed_4x8_integer_dot_product"   # a WGSL language feature (ir/kir.py PACKED_4X8)

# "max_*" limits a module records must not exceed the adapter's; "min_*" must be multiples of it
CHECKED_LIMITS = ("max_compute_invocations_per_workgroup", "max_compute_workgroup_size_x",
                  "max_compute_workgroup_size_y", "max_compute_workgroup_size_z",
                  "max_compute_workgroup_storage_size", "max_compute_workgroups_per_dimension",
                  "max_storage_buffers_per_shader_stage", "max_storage_buffer_binding_size", "max_buffer_size")


def check_requirements(needed: dict, have: dict) -> None:
    """Raise a LimitsError naming the first limit or feature the module needs (its recorded
    limits) that the adapter (`have`, snake_case names) does not offer. Every runtime calls this
    before it creates anything: the native and browser drivers, and webiree.js follows it."""
    for key in CHECKED_LIMITS:
        if key in needed and key in have and needed[key] > have[key]:
            raise LimitsError(f"the model needs {key} = {needed[key]}, the adapter offers {have[key]}",
                              hint="rebuild the model for this adapter's limits (webiree build --limits adapter)")
    if needed.get("subgroup_size") and needed["subgroup_size"] != have.get("subgroup_size"):
        offers = (f"runs subgroups of {have['subgroup_size']}" if have.get("subgroup_size")
                  else "has no usable subgroups")
        raise LimitsError(f"the model's kernels broadcast within subgroups of {needed['subgroup_size']} "
                          f"invocations; this adapter {offers}",
                          hint="rebuild the model for this adapter (webiree build --limits adapter) "
                               "or with the default limits, which run anywhere")
    if needed.get("shader_f16") and not have.get("shader_f16"):
        raise LimitsError("the model's kernels store float16 activations as halves and need the shader-f16 "
                          "feature, which this adapter does not offer",
                          hint="use a build with the default variants (one without -f16 runs here)")
    if needed.get(PACKED_4X8) and not have.get(PACKED_4X8):
        raise LimitsError(f"the model's integer products use WGSL's pack4xI8 and dot4I8Packed (the language "
                          f"feature {PACKED_4X8}), which this browser's WebGPU does not offer",
                          hint="use a browser with that WGSL feature (Chromium 123 and later, Firefox, Safari 26), "
                               "or ship the model in float32 or float16")
    key = "min_storage_buffer_offset_alignment"
    if key in needed and key in have and needed[key] % have[key]:
        raise LimitsError(f"the model aligns buffers to {needed[key]} bytes; the adapter needs {have[key]}")


# words in an adapter's vendor / architecture / device / description that name a CPU renderer
CPU_RENDERERS = ("llvmpipe", "lavapipe", "swiftshader")


def adapter_class(info: dict) -> str:
    """'cpu' for a fallback / CPU adapter (wgpu's adapter_type 'CPU', WebGPU's isFallbackAdapter,
    or a name of llvmpipe, lavapipe or SwiftShader), else 'gpu': the kernel variant it runs
    (module/format.py pick_variant; webiree.js adapterClass follows this)."""
    if str(info.get("adapter_type", "")).upper() == "CPU" or info.get("is_fallback_adapter") is True:
        return "cpu"
    text = " ".join(str(info.get(k, "")) for k in ("vendor", "architecture", "device", "description")).lower()
    return "cpu" if any(w in text for w in CPU_RENDERERS) else "gpu"


def adapter_facts(info: dict, limits: dict) -> dict:
    """What a kernel variant's rule is matched against (module/format.py pick_variant): the device
    class, the subgroup size the driver measured or the adapter guarantees (0: none usable), and
    whether the device has shader-f16 (`limits` carries shader_f16: 1 where it does)."""
    return {"device_class": adapter_class(info), "subgroup_size": int(limits.get("subgroup_size") or 0),
            "shader_f16": int(limits.get("shader_f16") or 0)}
