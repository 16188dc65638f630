"""The schedule module: writer and reader (pure Python, standard library only).

The wire format is specified in docs/schedule-module.md; this file, the
JavaScript reader in web/ and that document must agree. In short: a 16-byte
header, then tagged sections (tag, byte length, payload; unknown tags are
skipped), all integers little-endian u32.
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass, field

MAGIC = b"WIRM"
VERSION = 1

DTYPES = ["f32", "i32", "u32", "bool"]
BUFFER_KINDS = ["weights", "input", "arena", "params"]
FORMATS = ["wgsl", "spirv"]

# opcodes of the command stream
OP_UPLOAD_INPUT = 0x01    # input_index
OP_DISPATCH = 0x02        # exec, gx, gy, gz, nbind, nbind x (slot, buffer, offset, size)
OP_READBACK = 0x05        # output_index
OP_DISPATCH_DYN = 0x06    # exec, rx, ry, rz (registers), nbind, bindings as in DISPATCH
OP_SET_REG = 0x10         # reg, immediate
OP_LOAD_DIM = 0x11        # reg, input_index, dim
OP_ARITH = 0x12           # arith_op, dst, a, b (registers)
OP_ASSERT_EQ = 0x13       # a, b (registers), message (string): the feed is refused unless r[a] == r[b]
ARITH_OPS = ["add", "sub", "mul", "div_floor", "div_ceil", "min", "max"]
DYNAMIC_RANK = 0x80000000  # IOS: a rank word with this bit is followed by one register word per dim
STATIC_DIM = 0xFFFFFFFF    # ... where this register word marks a dim that does not vary
BIND_READ, BIND_WRITE, BIND_UNIFORM = 0, 1, 2    # EXEC binding kinds (2: the dims buffer, a uniform buffer)

OPCODE_ARITY = {OP_UPLOAD_INPUT: 1, OP_READBACK: 1, OP_SET_REG: 2,
                OP_LOAD_DIM: 3, OP_ARITH: 4, OP_ASSERT_EQ: 3}

# VARS: kernel variants for classes of adapter (docs/schedule-module.md). A rule names what the
# adapter must be for its variant to be picked: comma-separated conditions 'key=value' on the
# adapter's facts (device_class: gpu | cpu; subgroup_size: N, where a workgroup of N invocations
# runs as exactly one subgroup; shader_f16: 1, the adapter offers shader-f16). The variant whose rule holds with the most conditions is picked;
# the first variant where none holds.
VARIANTS_TAG = b"VARS"


def variant_rule(name: str) -> str:
    """The rule of a variant named 'CLASS', 'CLASS-sgN', each optionally with '-f16', then optionally
    '-start' (compiler/driver.py variant_target): 'device_class=cpu,subgroup_size=8,shader_f16=1'.
    A start tier's rule ends in ',start=1', which no adapter's facts hold: it is never picked by
    the adapter, only run by webiree.js while the pipelines of the variant it starts compile."""
    start = name.endswith("-start")
    name = name.removesuffix("-start")
    half = name.endswith("-f16")
    cls, _, sg = name.removesuffix("-f16").partition("-sg")
    return (f"device_class={cls}" + (f",subgroup_size={sg}" if sg else "") + (",shader_f16=1" if half else "")
            + (",start=1" if start else ""))


def rule_conditions(rule: str) -> dict:
    """'device_class=cpu,subgroup_size=8' -> {'device_class': 'cpu', 'subgroup_size': '8'}."""
    return dict(c.split("=", 1) for c in rule.split(",") if "=" in c)


class ModuleFormatError(ValueError):
    """The bytes are not a schedule module this reader understands."""


@dataclass
class Executable:
    name: str
    format: str                   # 'wgsl' | 'spirv'
    code: bytes                   # WGSL text (utf-8) or SPIR-V words
    entry: str = "main"
    workgroup_size: tuple = (1, 1, 1)
    bindings: list = field(default_factory=list)   # [(slot, kind)]: BIND_READ | BIND_WRITE | BIND_UNIFORM


@dataclass
class BufferInfo:
    kind: str                     # 'weights' | 'input' | 'arena'
    size: int
    blob_offset: int = 0          # weights: where this page starts in the weights blob
    name: str = ""


@dataclass
class IOInfo:
    name: str
    dtype: str                    # internal storage type
    onnx_type: int                # ONNX elem type at the boundary (int64 inputs are narrowed to i32)
    shape: tuple                  # the largest shape (the shape itself where no dim varies)
    buffer: int
    offset: int
    size: int                     # bytes at the largest shape
    regs: tuple = ()              # dynamic modules: per dim, the register holding its size (None: fixed)

    @property
    def dynamic(self) -> bool:
        return any(r is not None for r in self.regs)


@dataclass
class Module:
    executables: list[Executable]
    buffers: list[BufferInfo]
    inputs: list[IOInfo]
    outputs: list[IOInfo]
    commands: list[tuple]         # (opcode, *operands)
    limits: dict = field(default_factory=dict)
    info: dict = field(default_factory=dict)       # debug metadata (dispatch names, fused nodes, configs)
    registers: int = 0
    symbols: list = field(default_factory=list)    # [(name, min, max)]: symbol k is register k
    variants: list = field(default_factory=list)   # [Variant]: kernels per adapter class (VARS); [] = one
    variant: str = ""             # the variant this module was cut to (select_variant), "" if none


@dataclass
class Variant:
    """One adapter class's command stream over the module's shared executables and buffers."""
    name: str                     # 'gpu' | 'cpu' (or any name)
    rule: str                     # 'device_class=cpu': picked on such an adapter (see pick_variant)
    commands: list                # a whole command stream, as Module.commands
    registers: int = 0
    info: dict = field(default_factory=dict)        # {"dispatches": [...]} as Module.info's, for this stream


# ----------------------------------------------------------------------------
class _Writer:
    def __init__(self):
        self.strings: list[str] = []
        self.index: dict[str, int] = {}

    def s(self, text: str) -> int:
        if text not in self.index:
            self.index[text] = len(self.strings)
            self.strings.append(text)
        return self.index[text]


def _u32s(*vals) -> bytes:
    for v in vals:
        if not 0 <= int(v) < (1 << 32):
            raise ModuleFormatError(f"value {v} does not fit in u32")
    return struct.pack(f"<{len(vals)}I", *[int(v) for v in vals])


def _blob(data: bytes) -> bytes:
    pad = (-len(data)) % 4
    return _u32s(len(data)) + data + b"\0" * pad


def _section(tag: bytes, payload: bytes) -> bytes:
    assert len(tag) == 4 and len(payload) % 4 == 0
    return tag + _u32s(len(payload)) + payload


def write_module(m: Module) -> bytes:
    w = _Writer()
    lims = _u32s(len(m.limits)) + b"".join(_u32s(w.s(k), v) for k, v in sorted(m.limits.items()))
    execs = [_u32s(len(m.executables))]
    for e in m.executables:
        execs.append(_u32s(w.s(e.name), w.s(e.entry), FORMATS.index(e.format), *e.workgroup_size, len(e.bindings)))
        execs.append(b"".join(_u32s(slot, int(wr)) for slot, wr in e.bindings))
        execs.append(_blob(e.code))
    bufs = [_u32s(len(m.buffers))]
    for b in m.buffers:
        bufs.append(_u32s(BUFFER_KINDS.index(b.kind), b.size, b.blob_offset, w.s(b.name)))
    ios = []
    for group in (m.inputs, m.outputs):
        ios.append(_u32s(len(group)))
        for io in group:
            rank = len(io.shape) | (DYNAMIC_RANK if io.dynamic else 0)
            ios.append(_u32s(w.s(io.name), DTYPES.index(io.dtype), io.onnx_type, io.buffer, io.offset, io.size,
                             rank, *io.shape))
            if io.dynamic:
                ios.append(_u32s(*(STATIC_DIM if r is None else r for r in io.regs)))
    def stream(commands, registers):
        out = [_u32s(len(commands), registers)]
        for c in commands:
            if c[0] == OP_ASSERT_EQ:
                c = (c[0], c[1], c[2], w.s(c[3]))
            out.append(_encode_command(c))
        return b"".join(out)

    cmds = [stream(m.commands, m.registers)]
    variants = [_u32s(len(m.variants))]
    for v in m.variants:
        variants.append(_u32s(w.s(v.name), w.s(v.rule)) + stream(v.commands, v.registers))
    syms = _u32s(len(m.symbols)) + b"".join(_u32s(w.s(n), lo, hi) for n, lo, hi in m.symbols)
    info = json.dumps(m.info, sort_keys=True, separators=(",", ":")).encode()
    strs = [_u32s(len(w.strings))] + [_blob(s.encode("utf-8")) for s in w.strings]
    body = b"".join([
        _section(b"STRS", b"".join(strs)),
        _section(b"LIMS", lims),
        _section(b"EXEC", b"".join(execs)),
        _section(b"BUFS", b"".join(bufs)),
        _section(b"IOS ", b"".join(ios)),
        _section(b"CMDS", b"".join(cmds)),
        *([_section(b"SYMS", syms)] if m.symbols else []),
        *([_section(VARIANTS_TAG, b"".join(variants))] if m.variants else []),
        _section(b"INFO", _blob(info)),
    ])
    # the reserved header word holds the CRC-32 of everything after the header (0: not recorded)
    n_sections = 6 + bool(m.symbols) + bool(m.variants)
    return MAGIC + struct.pack("<HHII", VERSION, 0, n_sections, zlib.crc32(body) or 1) + body


def _encode_command(c: tuple) -> bytes:
    op = c[0]
    if op in (OP_DISPATCH, OP_DISPATCH_DYN):
        _, ex, gx, gy, gz, binds = c
        out = _u32s(op, ex, gx, gy, gz, len(binds))
        return out + b"".join(_u32s(*b) for b in binds)
    if op not in OPCODE_ARITY or len(c) - 1 != OPCODE_ARITY[op]:
        raise ModuleFormatError(f"bad command {c}")
    return _u32s(*c)


# ----------------------------------------------------------------------------
class _Reader:
    def __init__(self, data: bytes, where: str):
        self.d = memoryview(data)
        self.p = 0
        self.where = where

    def u32(self) -> int:
        if self.p + 4 > len(self.d):
            raise ModuleFormatError(f"truncated {self.where} section")
        v = struct.unpack_from("<I", self.d, self.p)[0]
        self.p += 4
        return v

    def u32s(self, n: int) -> list[int]:
        if n < 0 or self.p + 4 * n > len(self.d):
            raise ModuleFormatError(f"truncated {self.where} section")
        v = list(struct.unpack_from(f"<{n}I", self.d, self.p))
        self.p += 4 * n
        return v

    def blob(self) -> bytes:
        n = self.u32()
        if self.p + n > len(self.d):
            raise ModuleFormatError(f"truncated {self.where} section")
        b = bytes(self.d[self.p:self.p + n])
        self.p += n + ((-n) % 4)
        return b


def read_module(data: bytes) -> Module:
    data = bytes(data)
    if len(data) < 16 or data[:4] != MAGIC:
        raise ModuleFormatError("not a webiree schedule module (bad magic)")
    version = struct.unpack_from("<H", data, 4)[0]
    if version != VERSION:
        raise ModuleFormatError(f"schedule module version {version}; this runtime reads version {VERSION}")
    crc = struct.unpack_from("<I", data, 12)[0]
    if crc and crc != (zlib.crc32(data[16:]) or 1):
        raise ModuleFormatError("checksum mismatch: the file was damaged after it was written")
    try:
        m = _read_sections(data)
    except (IndexError, KeyError, UnicodeDecodeError, ValueError, struct.error) as e:
        if isinstance(e, ModuleFormatError):
            raise
        raise ModuleFormatError(f"malformed module ({type(e).__name__}: {str(e)[:120]})") from None
    validate_module(m)
    return m


def _read_sections(data: bytes) -> Module:
    sections: dict[bytes, bytes] = {}
    p = 16
    while p < len(data):
        if p + 8 > len(data):
            raise ModuleFormatError("truncated section header")
        tag = data[p:p + 4]
        n = struct.unpack_from("<I", data, p + 4)[0]
        if p + 8 + n > len(data):
            raise ModuleFormatError(f"section {tag!r} runs past the end")
        sections[tag] = data[p + 8:p + 8 + n]
        p += 8 + n
    for tag in (b"STRS", b"EXEC", b"BUFS", b"IOS ", b"CMDS"):
        if tag not in sections:
            raise ModuleFormatError(f"missing section {tag.decode()}")

    r = _Reader(sections[b"STRS"], "STRS")
    strings = [r.blob().decode("utf-8") for _ in range(r.u32())]

    def s(i: int) -> str:
        if i >= len(strings):
            raise ModuleFormatError("string index out of range")
        return strings[i]

    limits = {}
    if b"LIMS" in sections:
        r = _Reader(sections[b"LIMS"], "LIMS")
        for _ in range(r.u32()):
            k, v = r.u32s(2)
            limits[s(k)] = v

    r = _Reader(sections[b"EXEC"], "EXEC")
    execs = []
    for _ in range(r.u32()):
        name, entry, fmt, wx, wy, wz, nb = r.u32s(7)
        binds = [tuple(r.u32s(2)) for _ in range(nb)]
        code = r.blob()
        execs.append(Executable(s(name), FORMATS[fmt], code, s(entry), (wx, wy, wz),
                                [(slot, kind) for slot, kind in binds]))

    r = _Reader(sections[b"BUFS"], "BUFS")
    bufs = []
    for _ in range(r.u32()):
        kind, size, off, name = r.u32s(4)
        bufs.append(BufferInfo(BUFFER_KINDS[kind], size, off, s(name)))

    r = _Reader(sections[b"IOS "], "IOS")
    groups = []
    for _ in range(2):
        items = []
        for _ in range(r.u32()):
            name, dt, ot, buf, off, size, rank = r.u32s(7)
            dynamic = bool(rank & DYNAMIC_RANK)
            rank &= ~DYNAMIC_RANK
            shape = tuple(r.u32s(rank))
            regs = tuple(None if x == STATIC_DIM else x for x in r.u32s(rank)) if dynamic else ()
            items.append(IOInfo(s(name), DTYPES[dt], ot, shape, buf, off, size, regs))
        groups.append(items)

    def stream(r: _Reader):
        n_cmds, n_regs = r.u32s(2)
        cmds = []
        for _ in range(n_cmds):
            op = r.u32()
            if op in (OP_DISPATCH, OP_DISPATCH_DYN):
                ex, gx, gy, gz, nb = r.u32s(5)
                binds = [tuple(r.u32s(4)) for _ in range(nb)]
                cmds.append((op, ex, gx, gy, gz, binds))
            elif op == OP_ASSERT_EQ:
                a, b, msg = r.u32s(3)
                cmds.append((op, a, b, s(msg)))
            elif op in OPCODE_ARITY:
                cmds.append((op, *r.u32s(OPCODE_ARITY[op])))
            else:
                raise ModuleFormatError(f"unknown opcode {op:#x}")
        return cmds, n_regs

    cmds, n_regs = stream(_Reader(sections[b"CMDS"], "CMDS"))
    variants = []
    if VARIANTS_TAG in sections:
        r = _Reader(sections[VARIANTS_TAG], "VARS")
        for _ in range(r.u32()):
            name, rule = r.u32s(2)
            variants.append(Variant(s(name), s(rule), *stream(r)))

    symbols = []
    if b"SYMS" in sections:
        r = _Reader(sections[b"SYMS"], "SYMS")
        for _ in range(r.u32()):
            name, lo, hi = r.u32s(3)
            symbols.append((s(name), lo, hi))
    info = {}
    if b"INFO" in sections:
        info = json.loads(_Reader(sections[b"INFO"], "INFO").blob() or b"{}")
    for v in variants:
        v.info = (info.get("variants") or {}).get(v.name, {})
    return Module(execs, bufs, groups[0], groups[1], cmds, limits, info, n_regs, symbols, variants)


def validate_module(m: Module) -> None:
    """Check every cross-reference of a module a runtime would follow blindly (indices, byte
    ranges inside their buffers, known opcodes), so a damaged file is a ModuleFormatError and
    never an IndexError or an out-of-bounds binding."""
    nb, ne = len(m.buffers), len(m.executables)

    def check(cond, what):
        if not cond:
            raise ModuleFormatError(f"inconsistent module: {what}")

    for i, b in enumerate(m.buffers):
        check(b.size % 4 == 0, f"buffer {i} size {b.size} is not a multiple of 4")
    for e in m.executables:
        slots = [slot for slot, _ in e.bindings]
        check(len(set(slots)) == len(slots), f"executable {e.name!r} repeats a binding slot")
        check(all(k in (BIND_READ, BIND_WRITE, BIND_UNIFORM) for _, k in e.bindings),
              f"executable {e.name!r} has an unknown binding kind")
    nsym = len(m.symbols)
    check(m.registers >= nsym, "fewer registers than symbols (symbol k is register k)")
    for name, lo, hi in m.symbols:
        check(lo <= hi, f"symbol {name!r} has an empty range {lo}..{hi}")
    for b in m.buffers:
        check(b.kind != "params" or b.size >= 4 * nsym, "the params buffer is smaller than its symbols")
    for group, ios in (("input", m.inputs), ("output", m.outputs)):
        for io in ios:
            n = 1
            for d in io.shape:
                n *= d
            check(io.buffer < nb, f"{group} {io.name!r} names buffer {io.buffer} of {nb}")
            check(io.size == 4 * n, f"{group} {io.name!r} has {io.size} bytes for shape {tuple(io.shape)}")
            check(not io.regs or len(io.regs) == len(io.shape), f"{group} {io.name!r} has a register per dim")
            check(all(r is None or r < m.registers for r in io.regs), f"{group} {io.name!r} names a missing register")
            if group == "input":
                check(all(r is None or r < nsym for r in io.regs), f"input {io.name!r}: a varying dim is not a symbol")
            check(io.offset + io.size <= m.buffers[io.buffer].size,
                  f"{group} {io.name!r} runs past the end of its buffer")
    check(len({v.name for v in m.variants}) == len(m.variants), "two variants share a name")
    for v in m.variants:
        cond = rule_conditions(v.rule)
        check(set(cond) <= {"device_class", "subgroup_size", "shader_f16", "start"}
              and cond.get("subgroup_size", "1").isdigit() and cond.get("shader_f16", "1") == "1"
              and cond.get("start", "1") == "1",
              f"variant {v.name!r} has a rule this reader does not know: {v.rule!r}")
        check(v.registers >= nsym and all(r is None or r < v.registers for io in m.outputs for r in io.regs),
              f"variant {v.name!r} has fewer registers than its symbols and outputs name")
        _check_stream(m, v.commands, v.registers, check)
    _check_stream(m, m.commands, m.registers, check)


def _check_stream(m: Module, commands: list, registers: int, check) -> None:
    nb, ne = len(m.buffers), len(m.executables)
    for c in commands:
        op = c[0]
        if op in (OP_DISPATCH, OP_DISPATCH_DYN):
            _, ex, gx, gy, gz, binds = c
            check(ex < ne, f"a dispatch names executable {ex} of {ne}")
            if op == OP_DISPATCH_DYN:
                check(max(gx, gy, gz) < max(registers, 1), "a dispatch reads a register out of range")
            slots = {slot for slot, _ in m.executables[ex].bindings}
            check({b[0] for b in binds} == slots and len(binds) == len(slots),
                  f"a dispatch of {m.executables[ex].name!r} does not bind exactly its slots")
            for slot, buf, off, size in binds:
                check(buf < nb and size > 0 and off + size <= m.buffers[buf].size,
                      f"a dispatch of {m.executables[ex].name!r} binds bytes outside buffer {buf}")
        elif op == OP_UPLOAD_INPUT:
            check(c[1] < len(m.inputs), "UPLOAD_INPUT names a missing input")
        elif op == OP_READBACK:
            check(c[1] < len(m.outputs), "READBACK names a missing output")
        elif op == OP_ASSERT_EQ:
            check(c[1] < max(registers, 1) and c[2] < max(registers, 1), "ASSERT_EQ names a missing register")
        elif op in (OP_SET_REG, OP_ARITH):
            check(all(r < max(registers, 1) for r in (c[1:2] if op == OP_SET_REG else c[2:])),
                  "a register index is out of range")
            if op == OP_ARITH:
                check(c[1] < len(ARITH_OPS), f"unknown arithmetic op {c[1]}")
        elif op == OP_LOAD_DIM:
            check(c[1] < max(registers, 1) and c[2] < len(m.inputs) and c[3] < len(m.inputs[c[2]].shape),
                  "LOAD_DIM names a missing input dim or register")


def eval_registers(m: Module, dims: dict) -> list[int]:
    """The register file of one run of a dynamic module: `dims` is {input index: fed shape}.
    Registers are assigned once per run (LOAD_DIM, SET_REG, ARITH in command order), so every
    runtime evaluates them all before the first dispatch. The caller has checked the feeds
    (check_dims)."""
    regs = [0] * max(m.registers, 1)
    for c in m.commands:
        op = c[0]
        if op == OP_SET_REG:
            regs[c[1]] = c[2]
        elif op == OP_LOAD_DIM:
            regs[c[1]] = int(dims[c[2]][c[3]])
        elif op == OP_ARITH:
            _, aop, dst, a, b = c
            regs[dst] = arith(ARITH_OPS[aop], regs[a], regs[b])
    return regs


def failed_asserts(m: Module, regs) -> list[str]:
    """The messages of the ASSERT_EQ commands this run's registers break."""
    return [f"{c[3]}: {regs[c[1]]} != {regs[c[2]]}" for c in m.commands
            if c[0] == OP_ASSERT_EQ and regs[c[1]] != regs[c[2]]]


def arith(op: str, a: int, b: int) -> int:
    if op == "add":
        return a + b
    if op == "sub":
        return a - b
    if op == "mul":
        return a * b
    if op == "div_floor":
        return a // b if b else 0
    if op == "div_ceil":
        return -(-a // b) if b else 0
    if op == "min":
        return min(a, b)
    return max(a, b)


def shape_of(io: IOInfo, regs) -> tuple:
    """An input's or output's shape in one run (its fixed shape in a static module)."""
    if not io.regs:
        return tuple(io.shape)
    return tuple(d if r is None else regs[r] for d, r in zip(io.shape, io.regs))


# ----------------------------------------------------------------------------
def pick_variant(m: Module, facts, requested: str | None = None) -> str:
    """The variant a session runs: `requested` (a name; ModuleFormatError naming the variants if
    the build has no such one), else the one whose rule holds for the adapter's `facts`
    ({'device_class': 'gpu'|'cpu', 'subgroup_size': N or 0}; a str is the device class alone) with
    the most conditions (the first of equals), else the first. "" for a module without variants.
    facts may also say 'shader_f16': 1 (the adapter offers shader-f16)."""
    names = [v.name for v in m.variants]
    if requested:
        if requested not in names:   # webiree.js says the same
            raise ModuleFormatError(f"the build has no kernel variant {requested!r} (it has: "
                                    f"{', '.join(names) or 'none'})")
        return requested
    if not names:
        return ""
    if isinstance(facts, str):
        facts = {"device_class": facts}
    have = {k: str(v) for k, v in facts.items() if v}
    best, most = names[0], -1
    for v in m.variants:
        cond = rule_conditions(v.rule)
        if all(have.get(k) == val for k, val in cond.items()) and len(cond) > most:
            best, most = v.name, len(cond)
    return best


def select_variant(m: Module, name: str) -> Module:
    """The module a runtime runs for variant `name` (pick_variant): its command stream over only
    the executables it dispatches (renumbered in their order in the table), its dispatch info;
    buffers, inputs, outputs and symbols are shared, and the limits are the module's plus the
    subgroup size the variant's rule names (so the runtime checks and requests it). A module
    without variants (name "") is returned as it is."""
    if not name:
        return m
    v = next(v for v in m.variants if v.name == name)
    used = sorted({c[1] for c in v.commands if c[0] in (OP_DISPATCH, OP_DISPATCH_DYN)})
    new = {old: i for i, old in enumerate(used)}
    commands = [(c[0], new[c[1]], *c[2:]) if c[0] in (OP_DISPATCH, OP_DISPATCH_DYN) else c for c in v.commands]
    info = {k: val for k, val in m.info.items() if k != "variants"}
    info["dispatches"] = [{**d, "exec": new.get(d.get("exec"), d.get("exec"))} for d in v.info.get("dispatches", [])]
    limits = dict(m.limits)
    for key in ("subgroup_size", "shader_f16"):     # the rule's own requirements
        if rule_conditions(v.rule).get(key):
            limits[key] = int(rule_conditions(v.rule)[key])
    return Module([m.executables[i] for i in used], m.buffers, m.inputs, m.outputs, commands, limits, info,
                  v.registers, m.symbols, [], name)


def variant_counts(module) -> list[dict]:
    """Per variant: name, rule, the executables it dispatches, and how many of them another
    variant dispatches too (stored once). [] for a module without variants."""
    used = {v.name: {c[1] for c in v.commands if c[0] in (OP_DISPATCH, OP_DISPATCH_DYN)}
            for v in module.variants}
    return [{"name": v.name, "rule": v.rule, "executables": len(used[v.name]),
             "shared": len(used[v.name] & set().union(*(u for n, u in used.items() if n != v.name)))}
            for v in module.variants]
