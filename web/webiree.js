// webiree.js: the browser runtime of webiree. One dependency-free ES module.
//
// It reads a build folder (manifest.json, model.wrm, weights.bin), and runs the
// schedule module on navigator.gpu with the same interpreter as
// webiree/hal_webgpu/interpreter.py. The wire format is docs/schedule-module.md.
// The API mirrors onnxruntime-web:
//
//   import * as webiree from './webiree.js';
//   const session = await webiree.InferenceSession.create('./', {onProgress});
//   const results = await session.run({x: new webiree.Tensor('float32', data, [1, 64])});
//   results.probs.data  // Float32Array
//
// A dynamic module (sizes in ranges, `--dim sequence=1..512`): each run binds the symbols from the
// fed dims (bindDims), writes them into the `params` buffer, dispatches with register counts and
// moves only its own bytes; outputs come back at the run's dims. Nothing is compiled per size.

const TIMEOUT_MS = 30000;
const DTYPES = ['f32', 'i32', 'u32', 'bool'];
const KINDS = ['weights', 'input', 'arena', 'params'];
const FORMATS = ['wgsl', 'spirv'];
const OP = {UPLOAD_INPUT: 1, DISPATCH: 2, READBACK: 5, DISPATCH_DYN: 6,
  SET_REG: 0x10, LOAD_DIM: 0x11, ARITH: 0x12, ASSERT_EQ: 0x13};
const ARITY = {1: 1, 5: 1, 0x10: 2, 0x11: 3, 0x12: 4, 0x13: 3};
// add, sub, mul, div_floor, div_ceil (0 for a zero divisor), min, max
const ARITH = [(a, b) => a + b, (a, b) => a - b, (a, b) => a * b, (a, b) => (b ? Math.floor(a / b) : 0),
  (a, b) => (b ? Math.ceil(a / b) : 0), Math.min, Math.max];
const DYNAMIC_RANK = 0x80000000;  // IOS: a rank word with this bit is followed by one register word per dim
const STATIC_DIM = 0xffffffff;    // ... where this register word marks a dim that does not vary
const BIND_UNIFORM = 2;           // EXEC binding kinds: 0 storage (read), 1 storage (written), 2 uniform (the dims)
// ONNX element type -> [tensor type name, typed array class]
const ONNX_TYPES = {1: ['float32', Float32Array], 2: ['uint8', Uint8Array], 3: ['int8', Int8Array],
  4: ['uint16', Uint16Array], 5: ['int16', Int16Array], 6: ['int32', Int32Array], 7: ['int64', BigInt64Array],
  9: ['bool', Uint8Array], 10: ['float16', Uint16Array], 11: ['float64', Float64Array], 12: ['uint32', Uint32Array],
  13: ['uint64', BigUint64Array], 16: ['bfloat16', Uint16Array]};
const ARRAY_OF = Object.fromEntries(Object.values(ONNX_TYPES));
// float16 / bfloat16 are computed in f32 (dtypes.py `rounded`): feeds are Uint16Array bits (float16 also a
// Float16Array where the browser has one); float16 outputs are a Float16Array where the browser has one,
// else Uint16Array bits, bfloat16 outputs Uint16Array bits; every conversion is exact
const F16_ARRAY = globalThis.Float16Array;
function f32OfF16Bits(h) {
  const s = h & 0x8000 ? -1 : 1, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  if (e === 0) return s * m * 2 ** -24;
  if (e === 31) return m ? NaN : s * Infinity;
  return s * (1024 + m) * 2 ** (e - 25);
}
function f16BitsOfF32Bits(u) {  // u: the bits of an f32 that is a float16 value (kernels rounded it)
  const sign = (u >>> 16) & 0x8000, a = u & 0x7fffffff;
  if (a > 0x7f800000) return sign | 0x7e00;
  if (a === 0x7f800000) return sign | 0x7c00;
  if (a >= 0x38800000) return sign | ((a - 0x38000000) >>> 13);
  const f = new Float32Array(new Uint32Array([a]).buffer)[0];
  return sign | Math.round(f * 2 ** 24);
}
// limits the module records; "max_*" must not exceed the adapter's, "min_*" must be multiples of it
const CHECKED = ['max_compute_invocations_per_workgroup', 'max_compute_workgroup_size_x',
  'max_compute_workgroup_size_y', 'max_compute_workgroup_size_z', 'max_compute_workgroup_storage_size',
  'max_compute_workgroups_per_dimension', 'max_storage_buffers_per_shader_stage',
  'max_storage_buffer_binding_size', 'max_buffer_size'];

/** Every failure a caller can cause: kind is 'model', 'feed', 'device', 'limits' or 'tokenizer' (tokenizer.js). */
export class WebireeError extends Error {
  constructor(kind, message, hint) {
    super(hint ? `${message} (${hint})` : message);
    this.name = 'WebireeError';
    this.kind = kind;
    this.hint = hint;
  }
}
const fail = (kind, message, hint) => { throw new WebireeError(kind, message, hint); };
const show = (dims) => `[${dims.join(', ')}]`;
const numel = (dims) => dims.reduce((a, b) => a * b, 1);
const round4 = (n) => Math.ceil(n / 4) * 4;
const camel = (s) => s.replace(/_([a-z])/g, (_, c) => c.toUpperCase());

/** Reject with a clear message if `promise` takes longer than `ms` (a GPU hang must fail fast). */
function withTimeout(promise, ms, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new WebireeError('device', `${what} did not finish within ${ms} ms`,
      'the GPU may be hung or overloaded; reload the page')), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

export class Tensor {
  /** new Tensor('float32', Float32Array, dims) or new Tensor(typedArray, dims) */
  constructor(type, data, dims) {
    if (typeof type !== 'string') {
      [data, dims] = [type, data];
      type = F16_ARRAY && data instanceof F16_ARRAY ? 'float16'
        : Object.keys(ARRAY_OF).find((t) => data instanceof ARRAY_OF[t] && t !== 'bool');
      if (!type) fail('feed', 'cannot infer the tensor type of this data; pass the type first');
    }
    const Cls = ARRAY_OF[type] ?? fail('feed', `unsupported tensor type '${type}'`);
    if (Array.isArray(data)) data = (type === 'int64' || type === 'uint64') ? Cls.from(data, BigInt) : Cls.from(data);
    if (!(data instanceof Cls || (type === 'float16' && F16_ARRAY && data instanceof F16_ARRAY))) {
      fail('feed', `a '${type}' tensor needs a ${Cls.name}, got ${data?.constructor?.name}`);
    }
    this.type = type;
    this.data = data;
    this.dims = dims ? Array.from(dims, Number) : [data.length];
    this.size = data.length;
    this.location = 'cpu';
  }

  /** The tensor's data (a GPU tensor is read back from its buffer). */
  async getData() {
    if (this.location === 'cpu') return this.data;
    if (this.location !== 'gpu-buffer') fail('feed', `tensor '${this._io?.name}' was disposed`);
    return this._session._download(this);
  }

  /** Free a GPU tensor's buffer now (also done by session.release()); a CPU tensor has nothing to free. */
  dispose() {
    if (this.location !== 'gpu-buffer') return;
    this._session._resident.delete(this);
    this.gpuBuffer.destroy();
    this.gpuBuffer = undefined;
    this.location = 'none';
  }
}

/** An output kept on the GPU (run(feeds, {keep})): location 'gpu-buffer', its own gpuBuffer, the dims of its run. */
function gpuTensor(session, io, buffer, dims) {
  const t = Object.create(Tensor.prototype);
  Object.defineProperty(t, 'data', {get() {
    fail('feed', `tensor '${io.name}' is on the GPU (location '${t.location}')`, 'use await tensor.getData()');
  }});
  Object.assign(t, {type: ONNX_TYPES[io.onnxType]?.[0] ?? 'float32', dims: [...dims],
    size: numel(dims), location: 'gpu-buffer', gpuBuffer: buffer, _session: session, _io: io});
  return t;
}

// ---------------------------------------------------------------- module reader
class Reader {
  constructor(bytes, where) { this.v = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength); this.p = 0; this.where = where; }
  u32() {
    if (this.p + 4 > this.v.byteLength) fail('model', `model.wrm is truncated (${this.where} section)`);
    const x = this.v.getUint32(this.p, true);
    this.p += 4;
    return x;
  }
  u32s(n) { return Array.from({length: n}, () => this.u32()); }
  blob() {
    const n = this.u32();
    if (this.p + n > this.v.byteLength) fail('model', `model.wrm is truncated (${this.where} section)`);
    const b = new Uint8Array(this.v.buffer, this.v.byteOffset + this.p, n);
    this.p += n + ((4 - (n % 4)) % 4);
    return b;
  }
}

/** Parse a schedule module (ArrayBuffer or Uint8Array) into plain objects. */
export function readModule(data) {
  const bytes = data instanceof Uint8Array ? data : new Uint8Array(data);
  const text = new TextDecoder();
  const hint = 'rebuild the model with this version of webiree';
  if (bytes.length < 16 || text.decode(bytes.subarray(0, 4)) !== 'WIRM') {
    fail('model', 'model.wrm is not a webiree schedule module (bad magic)', hint);
  }
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const version = view.getUint16(4, true);
  if (version !== 1) fail('model', `model.wrm is schedule module version ${version}; this runtime reads version 1`, hint);
  const sections = {};
  for (let p = 16; p < bytes.length;) {
    if (p + 8 > bytes.length) fail('model', 'model.wrm is truncated (section header)', hint);
    const tag = text.decode(bytes.subarray(p, p + 4));
    const n = view.getUint32(p + 4, true);
    if (p + 8 + n > bytes.length) fail('model', `model.wrm is truncated (section ${tag} runs past the end)`, hint);
    sections[tag] = bytes.subarray(p + 8, p + 8 + n);  // unknown tags are kept and ignored
    p += 8 + n;
  }
  for (const tag of ['STRS', 'EXEC', 'BUFS', 'IOS ', 'CMDS']) {
    if (!sections[tag]) fail('model', `model.wrm has no ${tag.trim()} section`, hint);
  }
  let r = new Reader(sections.STRS, 'STRS');
  const strings = Array.from({length: r.u32()}, () => text.decode(r.blob()));
  const s = (i) => (i < strings.length ? strings[i] : fail('model', 'model.wrm: string index out of range'));
  const pick = (table, i, what) => table[i] ?? fail('model', `model.wrm: unknown ${what} ${i}`);

  const limits = {};
  if (sections.LIMS) {
    r = new Reader(sections.LIMS, 'LIMS');
    for (let n = r.u32(); n > 0; n--) { const [k, v] = r.u32s(2); limits[s(k)] = v; }
  }
  r = new Reader(sections.EXEC, 'EXEC');
  const executables = Array.from({length: r.u32()}, () => {
    const [name, entry, fmt, wx, wy, wz, nb] = r.u32s(7);
    const bindings = Array.from({length: nb}, () => { const [slot, kind] = r.u32s(2); return {slot, kind, writes: kind === 1}; });
    return {name: s(name), entry: s(entry), format: pick(FORMATS, fmt, 'executable format'),
      workgroupSize: [wx, wy, wz], bindings, code: r.blob()};
  });
  r = new Reader(sections.BUFS, 'BUFS');
  const buffers = Array.from({length: r.u32()}, () => {
    const [kind, size, blobOffset, name] = r.u32s(4);
    return {kind: pick(KINDS, kind, 'buffer kind'), size, blobOffset, name: s(name)};
  });
  r = new Reader(sections['IOS '], 'IOS');
  const [inputs, outputs] = [0, 1].map(() => Array.from({length: r.u32()}, () => {
    const [name, dtype, onnxType, buffer, offset, size, word] = r.u32s(7);
    const varies = word >= DYNAMIC_RANK, dims = r.u32s(varies ? word - DYNAMIC_RANK : word);
    // per dim, the register holding its size in a run (null: fixed); [] in a static entry
    const regs = varies ? r.u32s(dims.length).map((x) => (x === STATIC_DIM ? null : x)) : [];
    return {name: s(name), dtype: pick(DTYPES, dtype, 'dtype'), onnxType, buffer, offset, size, dims, regs,
      dynamic: regs.some((x) => x !== null)};
  }));
  const stream = (r) => {   // CMDS, and one per variant in VARS
    const [count, registers] = r.u32s(2);
    return {registers, commands: Array.from({length: count}, () => {
      const op = r.u32();
      if (op === OP.DISPATCH || op === OP.DISPATCH_DYN) {
        const [exec, gx, gy, gz, nb] = r.u32s(5);
        return [op, exec, gx, gy, gz, Array.from({length: nb}, () => r.u32s(4))];
      }
      if (!(op in ARITY)) fail('model', `model.wrm: unknown opcode 0x${op.toString(16)}`, hint);
      const args = r.u32s(ARITY[op]);
      return op === OP.ASSERT_EQ ? [op, args[0], args[1], s(args[2])] : [op, ...args];
    })};
  };
  const {registers, commands} = stream(new Reader(sections.CMDS, 'CMDS'));
  const variants = [];
  if (sections.VARS) {
    r = new Reader(sections.VARS, 'VARS');
    for (let n = r.u32(); n > 0; n--) { const [name, rule] = r.u32s(2); variants.push({name: s(name), rule: s(rule), ...stream(r)}); }
  }
  const symbols = [];
  if (sections.SYMS) {
    r = new Reader(sections.SYMS, 'SYMS');
    for (let n = r.u32(); n > 0; n--) { const [name, min, max] = r.u32s(3); symbols.push({name: s(name), min, max}); }
  }
  let info = {};
  if (sections.INFO) {
    try { info = JSON.parse(text.decode(new Reader(sections.INFO, 'INFO').blob()) || '{}'); } catch { info = {}; }
  }
  for (const b of buffers) if (b.size % 4) fail('model', `model.wrm: buffer ${b.name} size ${b.size} is not a multiple of 4`);
  const m = {executables, buffers, inputs, outputs, commands, registers, limits, info, symbols, variants, variant: ''};
  for (const x of [m, ...variants]) checkRegisters({...m, ...x}, hint);
  return m;
}

/** 'cpu' for a fallback / CPU adapter, else 'gpu' (requirements.py adapter_class). */
export function adapterClass(a) {
  const i = a?.info ?? {};
  return i.isFallbackAdapter || a?.isFallbackAdapter ||
    /llvmpipe|lavapipe|swiftshader/i.test([i.vendor, i.architecture, i.device, i.description].join()) ? 'cpu' : 'gpu';
}

/** N where the adapter guarantees subgroups of exactly N invocations, else 0 (browser_driver.py _subgroup_size). */
export function adapterSubgroupSize(a) {
  const i = a?.info ?? {};
  return a?.features?.has?.('subgroups') && i.subgroupMinSize > 0 && i.subgroupMinSize === i.subgroupMaxSize ? i.subgroupMinSize : 0;
}

/** The variant whose rule holds for the adapter with the most conditions, else the first (format.py pick_variant). */
function pickVariant(vs, adapter) {
  const have = {device_class: adapterClass(adapter), subgroup_size: String(adapterSubgroupSize(adapter) || ''),
    shader_f16: adapter?.features?.has?.('shader-f16') ? '1' : ''};
  let best = vs[0], most = -1;
  for (const v of vs) {
    const cond = v.rule.split(',').filter((c) => c.includes('=')).map((c) => c.split('='));
    if (cond.every(([k, val]) => have[k] === val) && cond.length > most) { best = v; most = cond.length; }
  }
  return best;
}

/** The module cut to one kernel variant (format.py pick_variant, select_variant), its start tier ('-start')
 * as `start` (or null); executables in order of first use, the start tier's first: the order they compile in. */
export function selectVariant(m, adapter, want, startTier = true) {
  const vs = m.variants;
  if (want && !vs.some((x) => x.name === want)) {
    fail('model', `the build has no kernel variant '${want}' (it has: ${vs.map((x) => x.name).join(', ') || 'none'})`);
  }
  if (!vs.length) return {...m, start: null};
  const v = vs.find((x) => x.name === want) ?? pickVariant(vs, adapter);
  const s = startTier ? vs.find((x) => x.name === `${v.name}-start`) ?? null : null;
  const sg = /(?:^|,)subgroup_size=(\d+)/.exec(v.rule);
  const limits = {...m.limits, ...(sg ? {subgroup_size: Number(sg[1])} : {}), ...(/(?:^|,)shader_f16=1/.test(v.rule) ? {shader_f16: 1} : {})};
  const isD = (c) => c[0] === OP.DISPATCH || c[0] === OP.DISPATCH_DYN;
  const used = [...new Set([...(s?.commands ?? []), ...v.commands].filter(isD).map((c) => c[1]))];
  const at = (e) => used.indexOf(e);
  const stream = (x) => ({commands: x.commands.map((c) => (isD(c) ? [c[0], at(c[1]), ...c.slice(2)] : c)), registers: x.registers,
    dispatches: (m.info.variants?.[x.name]?.dispatches ?? []).map((d) => ({...d, exec: at(d.exec)}))});
  const main = stream(v);
  return {...m, executables: used.map((i) => m.executables[i] ?? fail('model', `model.wrm: unknown executable ${i}`)), registers: main.registers, variants: [], variant: v.name, limits,
    commands: main.commands, info: {...m.info, dispatches: main.dispatches}, start: s && {name: s.name, ...stream(s)}};
}

/** Reject a binding kind, register, symbol or input dim a run would follow blindly (format.py validate_module). */
function checkRegisters({executables, symbols, registers, buffers, inputs, outputs, commands}, hint) {
  const nsym = symbols.length, nreg = Math.max(registers, 1), below = (n) => (x) => x === null || x < n;
  if (!(executables.every((e) => e.bindings.every((b) => b.kind <= BIND_UNIFORM)) && registers >= nsym &&
    symbols.every((x) => x.min <= x.max) && buffers.every((b) => b.kind !== 'params' || b.size >= 4 * nsym) &&
    inputs.every((io) => io.regs.every(below(nsym))) && outputs.every((io) => io.regs.every(below(registers))) &&
    commands.every(([op, ...a]) => (op === OP.DISPATCH_DYN ? a.slice(1, 4).every(below(nreg))
      : op === OP.SET_REG ? a[0] < nreg : op === OP.ARITH ? a[0] in ARITH && a.slice(1).every(below(nreg))
        : op === OP.ASSERT_EQ ? a[0] < nreg && a[1] < nreg
        : op !== OP.LOAD_DIM || (a[0] < nreg && a[2] < (inputs[a[1]]?.dims.length ?? 0)))))) {
    fail('model', 'model.wrm names a binding kind, register, symbol or input dim it does not have', hint);
  }
}

// ---------------------------------------------------------------- sizes of a run (dynamic modules)
/** The register file of a run: dims[i] is input i's shape; SET_REG, LOAD_DIM, ARITH in stream order. */
function evalRegisters(m, dims) {
  const regs = new Array(Math.max(m.registers, 1)).fill(0);
  for (const [op, a, b, x, y] of m.commands) {
    if (op === OP.SET_REG) regs[a] = b;
    else if (op === OP.LOAD_DIM) regs[a] = dims[b][x];
    else if (op === OP.ARITH) regs[b] = ARITH[a](regs[x], regs[y]);
  }
  return regs;
}

/** A shape in a run with registers `regs`; with `names`, as declared: a symbol's name where the dim
 * is one, null where it is computed from them (as onnxruntime shows symbolic dims). */
const shapeOf = (io, regs, names) => io.dims.map((d, i) => {
  const r = io.regs[i] ?? null;
  return r === null ? d : names ? names[r]?.name ?? null : regs[r];
});

/**
 * The register file of a run of a dynamic module: every symbol's value taken from the fed dims
 * (shapes[i]: input i's), checked against its range and its other occurrences, with the messages
 * of hal_webgpu/feeds.py bind_dims. _encode / _checkGpuFeed have checked the static inputs.
 */
function bindDims(m, shapes) {
  const seen = new Map();   // symbol -> [value, input name, dim]
  m.inputs.forEach((io, i) => {
    const like = `feed a shape like ${show(shapeOf(io, null, m.symbols))}`;
    if (shapes[i].length !== io.dims.length) {
      fail('feed', `input '${io.name}' has rank ${shapes[i].length}; the model's input has rank ${io.dims.length}`, like);
    }
    io.regs.forEach((r, axis) => {
      const d = shapes[i][axis];
      if (r === null) {
        if (d !== io.dims[axis]) fail('feed', `input '${io.name}' has ${d} at dim ${axis}; the model fixes it at ${io.dims[axis]}`, like);
        return;
      }
      const {name, min, max} = m.symbols[r], other = seen.get(r);
      if (!(d >= min && d <= max)) {
        fail('feed', `input '${io.name}': dim ${axis} (${name}) is ${d}, outside the build's range ${min}..${max}`,
          `rebuild with a wider range, e.g. --dim ${name}=${Math.min(min, d)}..${Math.max(max, d)}`);
      }
      if (other && other[0] !== d) {
        fail('feed', `dim ${name} is ${d} in input '${io.name}' (dim ${axis}) but ${other[0]} in input '${other[1]}' (dim ${other[2]})`,
          `every occurrence of ${name} must be equal`);
      }
      seen.set(r, [d, io.name, axis]);
    });
  });
  const regs = evalRegisters(m, shapes);
  // sizes the graph needs equal where the ranges cannot prove it (ASSERT_EQ, format.py failed_asserts)
  const broken = m.commands.find(([op, a, b]) => op === OP.ASSERT_EQ && regs[a] !== regs[b]);
  if (broken) {
    const sizes = [...seen].sort((x, y) => x[0] - y[0]).map(([r, v]) => `${m.symbols[r].name}=${v[0]}`).join(', ');
    fail('feed', `the model cannot take these sizes (${sizes}): ${broken[3]}: ${regs[broken[1]]} != ${regs[broken[2]]}`,
      'the graph needs these sizes to agree (e.g. an image side that is a multiple of the network\'s stride); feed sizes that do');
  }
  return regs;
}

// ---------------------------------------------------------------- loading
async function fetchResponse(url, init) {
  let response;
  try {
    response = await fetch(url, init);
  } catch (e) {
    fail('model', `cannot fetch ${url}: ${e.message}`, 'serve the build folder over http(s), e.g. `webiree serve DIR`');
  }
  if (!response.ok) fail('model', `cannot fetch ${url}: HTTP ${response.status}`, 'is this a webiree build folder?');
  return response;
}

async function fetchBytes(url, onChunk) {
  const response = await fetchResponse(url);
  if (!response.body) { const b = new Uint8Array(await response.arrayBuffer()); onChunk(b.length); return b; }
  const reader = response.body.getReader();
  const chunks = [];
  let length = 0;
  for (;;) {
    const {done, value} = await reader.read();
    if (done) break;
    chunks.push(value);
    length += value.length;
    onChunk(value.length);
  }
  const out = new Uint8Array(length);
  let p = 0;
  for (const c of chunks) { out.set(c, p); p += c.length; }
  return out;
}

// ---------------------------------------------------------------- weights: streamed, verified, cached
// The manifest records weights.bin's SHA-256 ("hashes": {"weights": "sha256-<hex>"}) and the file cut
// at the start of every weight page ("weight_pages": [{offset, size, sha256}], tiling the whole
// file). crypto.subtle cannot hash incrementally, so each range is collected in one buffer, its
// pages written to the GPU as soon as it is complete and its hash checked while the next range
// streams in: at most one range and the chunks in flight are held in JS, never the whole file twice,
// and every byte of the file is checked. A build without weight_pages is one range (the whole file,
// checked against hashes.weights when given): today's one copy.
// The bytes are kept in the Cache API (cache WEIGHTS_CACHE, keyed by the content hash, not the URL:
// two sites with the same weights share one entry) and read from there on the next visit, with no
// request for weights.bin. A damaged entry is deleted and the file downloaded; a download that does
// not match is fetched once more bypassing the HTTP cache, then refused. An entry is only stored
// whole and verified (its body stream is aborted otherwise, which makes cache.put store nothing).
export const WEIGHTS_CACHE = 'webiree-weights-v1';

async function sha256(bytes) {
  const digest = new Uint8Array(await crypto.subtle.digest('SHA-256', bytes));
  return 'sha256-' + Array.from(digest, (b) => b.toString(16).padStart(2, '0')).join('');
}

/** The ranges of weights.bin to verify one by one, each with the weight pages inside it. */
function weightRanges(manifest, module, file) {
  const pages = module.buffers.map((b, i) => ({...b, index: i})).filter((b) => b.kind === 'weights' && b.size > 0);
  const listed = manifest.weight_pages;
  if (!Array.isArray(listed)) return [{offset: 0, size: null, sha256: manifest.hashes?.weights ?? null, pages}];
  let end = 0;
  const ranges = listed.map(({offset, size, sha256: hash}) => {
    if (offset !== end || !(size >= 0)) fail('model', `manifest.json: weight_pages do not tile ${file}`, 'rebuild the model');
    end += size;
    return {offset, size, sha256: hash ?? null,
      pages: pages.filter((b) => b.blobOffset >= offset && b.blobOffset + b.size <= offset + size)};
  }).filter((r) => r.size > 0);
  const expected = manifest.sizes?.weights_bytes ?? end;
  if (end !== expected) fail('model', `manifest.json: weight_pages cover ${end} bytes of ${file}, sizes say ${expected}`, 'rebuild the model');
  for (const b of pages) {
    if (!ranges.some((r) => r.pages.includes(b))) {
      fail('model', `${file} is ${end} bytes, too short for page ${b.name}`, 'the weights file is incomplete; rebuild or re-download it');
    }
  }
  return ranges;
}

/**
 * Stream `body` through the ranges: write each range's pages (write(page, bytes, offset)) once
 * the range is complete, check its hash behind the stream. tee(chunk) sees every chunk.
 * Returns null when every byte matched, else what did not.
 */
async function streamWeights(body, ranges, write, onChunk, tee) {
  const reader = body?.getReader();
  const open = [];          // the chunks of an open-ended range (a build without weight_pages)
  let r = 0, fill = 0, total = 0, bad = null, checking = Promise.resolve(), extra = false;
  let buf = ranges.length && ranges[0].size !== null ? new Uint8Array(ranges[0].size) : null;
  const finish = async (range, bytes) => {
    for (const b of range.pages) {
      if (b.blobOffset - range.offset + b.size > bytes.length) {
        fail('model', `weights.bin is ${bytes.length} bytes, too short for page ${b.name}`, 'the weights file is incomplete; rebuild or re-download it');
      }
      write(b, bytes, b.blobOffset - range.offset);
    }
    const before = checking;
    checking = (async () => {
      await before;
      if (bad || !range.sha256) return;
      const got = await sha256(bytes);
      if (got !== range.sha256) bad = {range, got, length: bytes.length};
    })();
    await before;            // at most one range waits for its hash
  };
  while (reader) {
    const {done, value} = await reader.read();
    if (done) break;
    onChunk(value.length);
    await tee?.(value);
    total += value.length;
    for (let p = 0; p < value.length;) {
      if (r >= ranges.length) { extra = true; break; }
      const range = ranges[r];
      if (range.size === null) { open.push(value.slice(p)); break; }
      const n = Math.min(range.size - fill, value.length - p);
      buf.set(value.subarray(p, p + n), fill);
      fill += n;
      p += n;
      if (fill === range.size) {
        await finish(range, buf);
        r++;
        fill = 0;
        buf = r < ranges.length && ranges[r].size !== null ? new Uint8Array(ranges[r].size) : null;
      }
    }
  }
  if (r < ranges.length && ranges[r].size === null) {
    const all = new Uint8Array(total);
    let p = 0;
    for (const c of open) { all.set(c, p); p += c.length; }
    open.length = 0;
    await finish(ranges[r], all);
    r++;
  }
  await checking;
  const expected = ranges.reduce((n, x) => n + (x.size ?? 0), 0);
  if (r < ranges.length || extra) return {total, expected};
  return bad;
}

/** The Cache API entry being written: chunks go in as they arrive; only commit() stores it. */
function cacheWriter(cache, key) {
  const {readable, writable} = new TransformStream();
  const stored = cache.put(key, new Response(readable, {headers: {'content-type': 'application/octet-stream'}}));
  stored.catch(() => {});
  const writer = writable.getWriter();
  let ok = true;
  return {
    async write(chunk) {
      if (!ok) return;
      try { await writer.ready; writer.write(chunk).catch(() => { ok = false; }); } catch { ok = false; }
    },
    async commit() {
      if (ok) await writer.close().then(() => stored).catch(() => {});
    },
    abort() { writer.abort(new Error('webiree: weights do not match the manifest')).catch(() => {}); },
  };
}

async function openCache(options, hash) {
  if (options.cache === false || !hash || !globalThis.caches) return null;
  try { return await globalThis.caches.open(WEIGHTS_CACHE); } catch { return null; }  // opaque origins throw
}

/**
 * Load the weights into the session's pages: from the Cache API when it holds them, else from url.
 * onChunk(n, retry): n more bytes arrived; retry(n): n bytes already counted were thrown away.
 * Returns where they came from: 'cache' or 'network'.
 */
async function loadWeights({url, file, manifest, module, options, write, onChunk, retry}) {
  const ranges = weightRanges(manifest, module, file);
  const hash = manifest.hashes?.weights;
  const cache = await openCache(options, hash);
  const key = cache && new Request(new URL(`/.webiree-weights/${hash}`, url));
  let counted = 0;
  const count = (n) => { counted += n; onChunk(n); };
  const again = () => { retry(counted); counted = 0; };
  if (cache) {
    const hit = await cache.match(key).catch(() => null);
    if (hit) {
      const bad = await streamWeights(hit.body, ranges, write, count).catch(() => ({}));
      if (!bad) return 'cache';
      await cache.delete(key).catch(() => {});
      again();
    }
  }
  for (let attempt = 0; ; attempt++) {
    const response = await fetchResponse(url, attempt ? {cache: 'reload'} : undefined);
    const entry = cache ? cacheWriter(cache, key) : null;
    let bad;
    try {
      bad = await streamWeights(response.body, ranges, write, count, entry && ((c) => entry.write(c)));
    } catch (e) {
      entry?.abort();
      if (e instanceof WebireeError) throw e;
      fail('model', `cannot fetch ${url}: ${e.message}`, 'the download broke off; reload the page');
    }
    if (!bad) {
      await entry?.commit();
      return 'network';
    }
    entry?.abort();
    if (attempt) {
      const {range, got, total, expected} = bad;
      const whole = ranges.length === 1;
      fail('model', range
        ? `${file}${whole ? '' : ` (bytes ${range.offset}-${range.offset + range.size - 1})`} has hash ${got}; ` +
          `the manifest says ${range.sha256}${whole ? '' : ` (whole file: ${hash})`}`
        : `${file} is ${total} bytes; the manifest says ${expected} (${hash})`,
      'the file changed since the build; rebuild or re-upload the whole build folder');
    }
    again();
  }
}

function requestAdapter(gpu, options, timeout) {
  return withTimeout(gpu.requestAdapter({powerPreference: options.powerPreference ?? 'high-performance'}),
    timeout, 'navigator.gpu.requestAdapter()');
}

/** A device of `adapter` with the limits and features the module needs (checked first). */
async function openDevice(adapter, module, timeout) {
  if (!adapter) fail('device', 'WebGPU is present but no GPU adapter is available', 'enable hardware acceleration, or try another browser');
  const requiredLimits = checkLimits(module.limits, adapter);
  const requiredFeatures = adapter.features.has('timestamp-query') ? ['timestamp-query'] : [];
  if (module.limits.subgroup_size) requiredFeatures.push('subgroups');
  if (module.limits.shader_f16) requiredFeatures.push('shader-f16');
  try {
    return await withTimeout(adapter.requestDevice({requiredLimits, requiredFeatures}), timeout, 'adapter.requestDevice()');
  } catch (e) {
    if (e instanceof WebireeError) throw e;
    fail('device', `the WebGPU adapter refused a device: ${e.message}`);
  }
}

function checkLimits(needed, adapter) {
  const required = {};
  for (const key of CHECKED) {
    const have = adapter.limits[camel(key)];
    if (!(key in needed) || have === undefined) continue;
    if (needed[key] > have) {
      fail('limits', `the model needs ${camel(key)} (${key}) = ${needed[key]}, this adapter offers ${have}`,
        "rebuild the model for this device's limits (webiree build --limits ...)");
    }
    required[camel(key)] = needed[key];
  }
  const sg = needed.subgroup_size;
  if (sg) {
    // kernels that broadcast within a workgroup need it to be exactly one subgroup of that size
    const info = adapter.info || {};
    if (!adapter.features.has('subgroups') || info.subgroupMinSize !== sg || info.subgroupMaxSize !== sg) {
      fail('limits', `the model's kernels broadcast within subgroups of ${sg} invocations; this adapter does not guarantee that size`,
        'rebuild the model with the default limits, which run anywhere');
    }
  }
  if (needed.packed_4x8_integer_dot_product && !globalThis.navigator?.gpu?.wgslLanguageFeatures?.has?.('packed_4x8_integer_dot_product')) {
    fail('limits', "the model's integer products use WGSL's pack4xI8 and dot4I8Packed (the language feature packed_4x8_integer_dot_product), which this browser's WebGPU does not offer",
      'use a browser with that WGSL feature (Chromium 123 and later, Firefox, Safari 26), or ship the model in float32 or float16');
  }
  if (needed.shader_f16 && !adapter.features.has('shader-f16')) {
    fail('limits', "the model's kernels store float16 activations as halves and need the shader-f16 feature, which this adapter does not offer",
      'use a build with the default variants (one without -f16 runs here)');
  }
  const key = 'min_storage_buffer_offset_alignment';
  const have = adapter.limits[camel(key)];
  if (key in needed && have && needed[key] % have) {
    fail('limits', `the model aligns buffers to ${needed[key]} bytes (${camel(key)}); this adapter needs ${have}`,
      "rebuild the model for this device's limits");
  }
  return required;
}

// ---------------------------------------------------------------- session
// A profiled run as a Chrome trace (Trace Event Format, for Perfetto or chrome://tracing): one
// complete event per dispatch at its GPU timestamps, with the ONNX nodes it fused; the same JSON
// as webiree's hal_webgpu/trace.py builds natively. ts: BigInt64Array of begin/end pairs (ns).
export function chromeTrace(info, ts, count) {
  const dispatches = info.dispatches ?? [];
  let t0 = null;
  for (let i = 0; i < count; i++) if (t0 === null || ts[2 * i] < t0) t0 = ts[2 * i];
  const events = [{name: 'process_name', ph: 'M', pid: 1, tid: 1,
    args: {name: `webiree ${info.model ?? ''} (GPU)`.replace('  ', ' ')}}];
  for (let i = 0; i < count; i++) {
    const d = dispatches[i] ?? {};
    const dur = ts[2 * i + 1] - ts[2 * i];
    events.push({name: d.name ?? `dispatch ${i}`, cat: d.kind ?? 'dispatch', ph: 'X', pid: 1, tid: 1,
      ts: Number(ts[2 * i] - t0) / 1000, dur: dur > 0n ? Number(dur) / 1000 : 0,
      args: {index: i, nodes: [...(d.nodes ?? [])], strategy: d.config?.strategy ?? ''}});
  }
  return {traceEvents: events, displayTimeUnit: 'ms'};
}

// ---------------------------------------------------------------- generation (module/generation.py)
const GEN = {INPUT_IDS: 'input_ids', ATTENTION_MASK: 'attention_mask', POSITION_IDS: 'position_ids', LOGITS: 'logits',
  K: 'generation.k', TEMPERATURE: 'generation.temperature', RNG: 'generation.rng', TOKEN: 'generation.token',
  RNG_NEXT: 'generation.rng_next', MASK_NEXT: 'generation.attention_mask_next', POSITIONS_NEXT: 'generation.position_ids_next'};
const GEN_ACCEPTS = 'a decoder with inputs input_ids, attention_mask (optional), position_ids (optional) and ' +
  'past_key_values.{i}.key/value, and outputs logits and present.{i}.key/value';
const PAST_RE = /^past_key_values\.(\d+)\.(key|value)$/;
const presentOf = (past) => past.replace(PAST_RE, 'present.$1.$2');

/** The checks and first feeds of one generation (hal_webgpu/generate.py Generation, with its words). */
function generationPlan(session, ids, options) {
  const m = session.module;
  const ins = Object.fromEntries(m.inputs.map((io) => [io.name, io]));
  const outs = new Set(session.outputNames);
  const past = m.inputs.map((io) => [io.name, io.name.match(PAST_RE)]).filter(([, x]) => x)
    .sort((a, b) => (+a[1][1] - +b[1][1]) || (a[1][2] === 'value') - (b[1][2] === 'value')).map(([n]) => n);
  const hasMask = GEN.ATTENTION_MASK in ins, hasPos = GEN.POSITION_IDS in ins;
  const needOut = [GEN.TOKEN, GEN.RNG_NEXT, ...(hasMask ? [GEN.MASK_NEXT] : []), ...(hasPos ? [GEN.POSITIONS_NEXT] : [])];
  const missing = [...[GEN.K, GEN.TEMPERATURE, GEN.RNG].filter((n) => !(n in ins)), ...needOut.filter((n) => !outs.has(n))];
  if (missing.length) {
    fail('model', `this build cannot generate: ${past.length ? 'it has no generation head' : 'it is not a decoder with a KV cache'} (missing ${JSON.stringify(missing)})`,
      `build the decoder with webiree.compile(model, out, dims=..., generation=True) (\`webiree build --generation\`); generation takes ${GEN_ACCEPTS}`);
  }
  const known = new Set([GEN.INPUT_IDS, GEN.ATTENTION_MASK, GEN.POSITION_IDS, GEN.K, GEN.TEMPERATURE, GEN.RNG, ...past]);
  const other = session.inputNames.filter((n) => !known.has(n));
  if (other.length) fail('model', `this build cannot generate: inputs ${JSON.stringify(other)} are not ones generation knows how to feed`, `generation takes ${GEN_ACCEPTS}`);
  const prompt = Array.from(ids ?? [], Number);
  const maxNewTokens = options.maxNewTokens ?? 16;
  const strategy = options.strategy ?? 'greedy';
  const topK = m.info.generation_top_k ?? 0;
  const temperature = options.temperature ?? 1.0;
  if (!prompt.length) fail('feed', 'the prompt is empty', 'give at least one token id');
  if (prompt.some((t) => !Number.isInteger(t))) fail('feed', 'the prompt must be a list of int token ids');
  if (!Number.isInteger(maxNewTokens) || maxNewTokens < 0) fail('feed', `maxNewTokens must be an int >= 0, got ${maxNewTokens}`);
  if (strategy !== 'greedy' && strategy !== 'top-k') fail('feed', `unknown strategy '${strategy}'`, "use 'greedy' or 'top-k'");
  let k = 1;
  if (strategy === 'top-k') {
    k = options.k ?? 50;
    if (!Number.isInteger(k) || k < 1) fail('feed', `top-k sampling needs k >= 1, got ${k}`);
    if (topK < 1) fail('feed', 'this build samples no top-k (its generation head is greedy only)', "rebuild with generation=N (top-k up to N), or use strategy='greedy'");
    if (k > topK) fail('feed', `k=${k} is above the build's top-k limit of ${topK}`, `use k <= ${topK}, or rebuild with generation=${k}`);
    if (!(typeof temperature === 'number' && temperature > 0)) fail('feed', `temperature must be > 0, got ${temperature}`);
  }
  const seed = options.seed ?? 0;
  if (!Number.isInteger(seed)) fail('feed', `seed must be an int, got ${seed}`);
  const state = Number((BigInt(seed) * 2654435761n + 0x9E3779B9n) & 0xFFFFFFFFn);   // module/generation.py seed_state
  const tensor = (name, values, dims) => {
    const [type, Cls] = ONNX_TYPES[ins[name].onnxType];
    return new Tensor(type, Cls.from(values, Cls === BigInt64Array || Cls === BigUint64Array ? BigInt : Number), dims);
  };
  // a past of length 0: its fixed dims, 1 for the batch (input_ids' first symbol), 0 for the past length
  const batchReg = ins[GEN.INPUT_IDS].regs[0] ?? null;
  const pastShape = (io, n) => io.dims.map((d, i) => {
    const r = io.regs[i] ?? null;
    return r === null ? d : r === batchReg ? 1 : n;
  });
  for (const p of past) {
    if (!ins[p].regs.some((r) => r !== null)) fail('model', `input '${p}' has the fixed shape ${show(ins[p].dims)}; the past length must vary`, "build with a range for the past length, e.g. dims={'past_sequence': (0, 127)}");
  }
  const n = prompt.length;
  const shapes = (seq, pastLen) => m.inputs.map((io) => {
    if (io.name === GEN.INPUT_IDS || io.name === GEN.POSITION_IDS) return [1, seq];
    if (io.name === GEN.ATTENTION_MASK) return [1, pastLen + seq];
    if (past.includes(io.name)) return pastShape(io, pastLen);
    return [1];
  });
  const fits = (what, seq, pastLen) => {
    try { bindDims(m, shapes(seq, pastLen)); } catch (e) {
      fail('feed', `a prompt of ${n} tokens and ${maxNewTokens} new tokens do not fit this build (${what}: ${e.message.replace(/ \(.*\)$/, '')})`,
        "give a shorter prompt or fewer new tokens, or rebuild with wider ranges (e.g. dims={'past_sequence': (0, N - 1), 'total_sequence': (1, N)})");
    }
  };
  fits('the first step', n, 0);
  if (maxNewTokens > 1) fits('the last step', 1, n + maxNewTokens - 2);
  const keep = [...past.map(presentOf), GEN.RNG_NEXT, ...(hasMask ? [GEN.MASK_NEXT] : []), ...(hasPos ? [GEN.POSITIONS_NEXT] : [])];
  const constants = {};
  try {
    constants[GEN.K] = session._upload(GEN.K, tensor(GEN.K, [k], [1]));
    constants[GEN.TEMPERATURE] = session._upload(GEN.TEMPERATURE, tensor(GEN.TEMPERATURE, [temperature], [1]));
    constants[GEN.RNG] = session._upload(GEN.RNG, tensor(GEN.RNG, [state], [1]));
  } catch (e) {
    for (const t of Object.values(constants)) t.dispose();
    throw e;
  }
  const first = {[GEN.INPUT_IDS]: tensor(GEN.INPUT_IDS, prompt, [1, n]), ...constants};
  if (hasMask) first[GEN.ATTENTION_MASK] = tensor(GEN.ATTENTION_MASK, prompt.map(() => 1), [1, n]);
  if (hasPos) first[GEN.POSITION_IDS] = tensor(GEN.POSITION_IDS, prompt.map((_, i) => i), [1, n]);
  for (const p of past) first[p] = tensor(p, [], pastShape(ins[p], 0));
  return {past, hasMask, hasPos, keep, outputs: [GEN.TOKEN, ...keep], constants, first, maxNewTokens,
    ids: (values, dims) => tensor(GEN.INPUT_IDS, values, dims)};
}

export class InferenceSession {
  /**
   * Load a build folder (URL relative to the page) and prepare it on a new WebGPU device.
   * options: {onProgress({loaded, total, file}), timeoutMs, powerPreference, cache, variant}
   * variant: 'gpu' or 'cpu' kernels of a build that has both; left out, the adapter picks.
   * cache: false never reads or stores the weights in the Cache API (see WEIGHTS_CACHE).
   * startTier: false runs the variant's own kernels from the first run, not its start tier's (_upgrade).
   * worker: true runs the session in a Web Worker (worker.js), off the page's main thread.
   */
  static async create(url, options = {}) {
    if (options.worker) return (await import('./worker.js')).createWorkerSession(url, options);
    const timeout = options.timeoutMs ?? TIMEOUT_MS;
    const gpu = globalThis.navigator?.gpu;
    if (!gpu) {
      fail('device', 'WebGPU is not available in this browser (navigator.gpu is missing)',
        'use a recent Chrome/Edge (or Firefox/Safari with WebGPU enabled) over https or localhost');
    }
    const base = new URL(url.endsWith('/') ? url : `${url}/`, globalThis.location?.href);
    const progress = {loaded: 0, total: 0, file: 'manifest.json'};
    const report = (file, n) => {
      progress.loaded += n;
      progress.file = file;
      options.onProgress?.({...progress, total: Math.max(progress.total, progress.loaded)});
    };
    const manifestUrl = new URL('manifest.json', base);
    const manifestText = new TextDecoder().decode(await fetchBytes(manifestUrl, (n) => report('manifest.json', n)));
    let manifest;
    try { manifest = JSON.parse(manifestText); } catch { fail('model', `${manifestUrl} is not JSON`, 'is this a webiree build folder?'); }
    const files = manifest.files ?? {};
    const [moduleFile, weightsFile] = [files.module ?? 'model.wrm', files.weights ?? 'weights.bin'];
    progress.total = progress.loaded + (manifest.sizes?.module_bytes ?? 0) + (manifest.sizes?.weights_bytes ?? 0);
    const adapterPromise = requestAdapter(gpu, options, timeout);
    // the weights are fetched only once the adapter can run the module (limits and features checked)
    const [moduleBytes, adapter] = await Promise.all([
      fetchBytes(new URL(moduleFile, base), (n) => report(moduleFile, n)), adapterPromise]);
    const module = selectVariant(readModule(moduleBytes), adapter, options.variant, options.startTier !== false);
    const device = await openDevice(adapter, module, timeout);
    const session = new InferenceSession(module, device, manifest, timeout);
    const weights = (write, onChunk = (n) => report(weightsFile, n), retry = (n) => { progress.total += n; }) =>
      loadWeights({url: new URL(weightsFile, base), file: weightsFile, manifest, module, options, write, onChunk, retry});
    // what recover() needs to rebuild the session on a new device
    session._rebuild = {gpu, options, weights: (write) => weights(write, () => {}, () => {})};
    try {
      session.weightsSource = await session._prepare(weights);
    } catch (e) {
      session._released = true;
      device.destroy();
      throw e;
    }
    return session;
  }

  constructor(module, device, manifest, timeoutMs) {
    this.module = module;
    this.device = device;
    this.manifest = manifest;
    this.timeoutMs = timeoutMs;
    this.inputNames = module.inputs.map((io) => io.name);
    this.outputNames = module.outputs.map((io) => io.name);
    this.dynamic = module.symbols.length > 0;   // sizes in ranges: each run binds them (bindDims)
    this.variant = module.variant;   // the kernel variant running ('' for a build with one)
    const meta = (io) => ({name: io.name, isTensor: true, type: ONNX_TYPES[io.onnxType]?.[0] ?? `onnx type ${io.onnxType}`,
      shape: shapeOf(io, null, module.symbols)});
    this.inputMetadata = module.inputs.map(meta);
    this.outputMetadata = module.outputs.map(meta);
    this.profile = null;
    this._queue = Promise.resolve();
    this._attach(device);
  }

  /** Make `device` the session's device: its errors and its loss are watched from now on. */
  _attach(device) {
    this._detach?.();
    let attached = true;
    this._detach = () => { attached = false; };
    this.device = device;
    this.hasTimestamps = device.features.has('timestamp-query');
    this._lostError = null;
    this._gpuErrors = [];
    device.lost.then((info) => {
      if (!attached) return;  // a device recover() has replaced, or one it gave up on
      this._lostError = new WebireeError('device', this._released ? 'the session was released'
        : `the WebGPU device was lost (${info.reason}): ${info.message}`,
      this._released ? 'create a new session' : 'call await session.recover() (or create a new session)');
    });
    device.addEventListener?.('uncapturederror', (e) => { if (attached) this._gpuErrors.push(e.error?.message ?? String(e.error)); });
    this._lost = device.lost.then(() => { throw this._lostError ?? new WebireeError('device', 'the WebGPU device was replaced'); });
    this._lost.catch(() => {});
  }

  /** true once the session's GPU device is lost (a driver reset, a GPU process crash, device.destroy()),
   * until recover() succeeds; false on a released session. */
  get lost() {
    return !this._released && (this._lostError !== null || !!this._recovering);
  }

  /**
   * After the device is lost: request a new adapter and device with the same options, check the
   * limits again, recreate the buffers, pipelines and bind groups, and load the weights again
   * (from the Cache API when they were cached there: no request for weights.bin). GPU tensors
   * kept from earlier runs are gone (disposed). A no-op when the device is fine; a 'device'
   * error on a released session. Queued after the runs already started, like run().
   */
  recover() {
    const result = this._queue.then(() => this._recover());
    this._queue = result.catch(() => {});
    return result;
  }

  async _recover() {
    if (this._released) fail('device', 'the session was released', 'create a new session');
    if (!this._lostError) return;
    const cause = this._lostError.message;
    for (const t of [...(this._resident ?? [])]) t.dispose();
    for (const b of [...(this.buffers ?? []), this.readback, this._resolve, this._times]) b?.destroy();
    this._query?.destroy();
    this._query = this._resolve = this._times = null;
    const {gpu, options, weights} = this._rebuild;
    let device;
    this._recovering = true;
    try {
      device = await openDevice(await requestAdapter(gpu, options, this.timeoutMs), this.module, this.timeoutMs);
      this._attach(device);
      this.weightsSource = await this._prepare(weights);
    } catch (e) {
      this._detach();
      device?.destroy();
      this._lostError = new WebireeError(e.kind === 'limits' ? 'limits' : 'device',
        `the WebGPU device was lost (${cause}) and recovering it failed: ${e.message}`,
        e.hint ?? 'call await session.recover() again later, or create a new session');
      throw this._lostError;
    } finally {
      this._recovering = false;
    }
  }

  /** Await a GPU promise, failing fast on a hang or a lost device. */
  _gpu(promise, what) {
    const lost = this._lost;
    return withTimeout(Promise.race([promise, lost]), this.timeoutMs, what).catch(async (e) => {
      if (e instanceof WebireeError) throw e;
      // a GPU promise rejected by a loss (mapAsync: 'the Device was lost') can settle before
      // device.lost does: give that a moment, to report the loss rather than its symptom
      await Promise.race([lost, new Promise((resolve) => setTimeout(resolve, 200))]);
      throw e;
    });
  }

  /** Create the buffers and start every pipeline's creation, in order of first use; stream the
   * weights into their pages (loadWeights(write)) meanwhile, and return once they are written
   * (where they came from): the pipelines go on compiling in the background, and a run waits
   * only for those it reaches (_reach). With a start tier, only its pipelines are started here;
   * _upgrade creates the variant's own ones after them. */
  async _prepare(loadWeights) {
    const {module: m, device: d} = this;
    const U = GPUBufferUsage;
    d.pushErrorScope('out-of-memory');
    d.pushErrorScope('validation');
    this.buffers = m.buffers.map((b, i) => d.createBuffer({label: b.name || `${b.kind}${i}`, size: Math.max(b.size, 4),
      usage: b.kind === 'params' ? U.UNIFORM | U.COPY_DST : U.STORAGE | U.COPY_SRC | U.COPY_DST}));
    this.params = this.buffers.filter((_, i) => m.buffers[i].kind === 'params');  // the dims buffers, written per run
    const loading = loadWeights((b, bytes, offset) => d.queue.writeBuffer(this.buffers[b.index], 0, bytes, offset, b.size));
    this._progress = {last: performance.now(), ready: 0};
    const isDispatch = (c) => c[0] === OP.DISPATCH || c[0] === OP.DISPATCH_DYN;
    const early = m.start ? new Set(m.start.commands.filter(isDispatch).map((c) => c[1])) : null;
    const pipelines = m.executables.map((e, i) => {
      if (e.format !== 'wgsl') fail('model', `executable ${e.name} is SPIR-V; browsers take WGSL only`, 'rebuild the model for WebGPU');
      let code = new TextDecoder().decode(e.code);
      // naga (where the WGSL is validated at build) takes subgroup builtins without the directive; Tint needs it
      if (code.includes('subgroupBroadcast(')) code = 'enable subgroups;\n' + code;
      const layout = d.createBindGroupLayout({label: e.name, entries: e.bindings.map(({slot, kind}) => (
        {binding: slot, visibility: GPUShaderStage.COMPUTE, buffer: {type: kind === BIND_UNIFORM ? 'uniform' : 'storage'}}))});
      const p = {layout, pipeline: null};
      const create = () => {
        const shader = d.createShaderModule({label: e.name, code});
        return d.createComputePipelineAsync({label: e.name, layout: d.createPipelineLayout({bindGroupLayouts: [layout]}),
          compute: {module: shader, entryPoint: e.entry}}).then((pipeline) => {
          p.pipeline = pipeline;
          this._progress.last = performance.now();
          this._progress.ready++;
        }, async (err) => {
          const info = await shader.getCompilationInfo?.().catch(() => null);
          const notes = (info?.messages ?? []).filter((x) => x.type === 'error').map((x) => `${x.lineNum}:${x.linePos}: ${x.message}`);
          fail('device', `cannot create the pipeline of dispatch ${e.name}: ${notes.length ? notes.join('; ') : err.message}`,
            'this is a webiree bug: the browser rejected WGSL it emitted; please report it with the model');
        });
      };
      if (!early || early.has(i)) p.promise = create();
      else p.promise = new Promise((resolve) => { p.begin = () => { p.begin = null; resolve(create()); }; });
      p.promise.catch(() => {});
      return p;
    });
    this._pipelines = pipelines;
    const source = await loading;
    this.uploads = m.commands.filter((c) => c[0] === OP.UPLOAD_INPUT).map((c) => c[1]);
    const readbackSize = m.commands.filter((c) => c[0] === OP.READBACK).reduce((n, c) => n + round4(m.outputs[c[1]].size), 0);
    // a tier: one command stream's dispatches; the variant's own, and its start tier's until _upgrade ends
    const tier = (name, {commands, registers, dispatches}) => {
      const view = {...m, commands, registers};   // what evalRegisters and bindDims read
      const regs = evalRegisters(view, m.inputs.map((io) => io.dims));   // a dynamic module's runs evaluate their own
      const items = commands.filter(isDispatch).map(([op, ex, gx, gy, gz, binds], index) => {
        const p = pipelines[ex] ?? fail('model', `model.wrm: dispatch of unknown executable ${ex}`);
        const bindGroup = d.createBindGroup({layout: p.layout, entries: binds.map(([slot, buf, offset, size]) => (
          {binding: slot, resource: {buffer: this.buffers[buf], offset, size}}))});
        const dyn = op === OP.DISPATCH_DYN;
        return {pipe: p, bindGroup, grid: dyn ? [regs[gx], regs[gy], regs[gz]] : [gx, gy, gz],
          regs: dyn && this.dynamic ? [gx, gy, gz] : null, name: dispatches[index]?.name ?? m.executables[ex].name,
          info: dispatches[index]};
      });
      return {name, view, items, plans: new Map()};
    };
    this._tier = tier(m.variant, {commands: m.commands, registers: m.registers, dispatches: m.info.dispatches ?? []});
    this._startTier = m.start ? tier(m.start.name, m.start) : null;
    this.items = this._tier.items;   // the dispatches; _plan adds the readback copies
    this.readback = d.createBuffer({label: 'readback', size: Math.max(readbackSize, 4), usage: U.MAP_READ | U.COPY_DST});
    this.dispatchCount = this.items.length;
    this._resident = new Set();
    const errors = [await this._gpu(d.popErrorScope(), 'popErrorScope()'), await this._gpu(d.popErrorScope(), 'popErrorScope()')];
    const error = errors.find(Boolean);
    if (error) fail('device', `WebGPU rejected the model while preparing it: ${error.message}`);
    if (this._startTier) this._upgrade(pipelines);
    return source;
  }

  /** With a start tier: once its pipelines are created, create the variant's other pipelines one at
   * a time, each begun when no run is executing (a run then competes with one compilation at most),
   * and switch the runs to the variant once all are created. Stops when the pipelines are replaced
   * (recover) or the session released; a failed creation is reported by the run or ready() that reaches it. */
  async _upgrade(pipelines) {
    try {
      for (const p of pipelines) if (!p.begin) await p.promise;
      for (const p of pipelines) {
        if (!p.begin) continue;
        if (this._running) await this._running;   // the run executing, not those queued: no starving
        if (this._pipelines !== pipelines || this._released) return;
        p.begin();
        await p.promise;
      }
      if (this._pipelines === pipelines) this._startTier = null;
    } catch {
      // the pipeline's own promise carries the error
    }
  }

  /** The kernel variant the next run uses: the start tier's name ('cpu-sg4-start') until the variant's
   * own pipelines are all created, then the variant's ('cpu-sg4'; session.variant). */
  get runningVariant() {
    return (this._startTier ?? this._tier)?.name ?? this.variant;
  }

  /** Wait for pipeline `p` (its creation started in _prepare). Pipelines compile in parallel and a
   * slow compiler (SwiftShader) may take minutes for all, so the timeout is "no pipeline finished
   * for timeoutMs" (counted from this wait at the earliest), not a limit per pipeline. */
  async _reach(p) {
    if (p.pipeline) return;
    const start = performance.now();
    let watch;
    const stalled = new Promise((_, reject) => {
      const check = () => {
        const {last, ready} = this._progress;
        if (performance.now() - Math.max(last, start) <= this.timeoutMs) { watch = setTimeout(check, 250); return; }
        reject(new WebireeError('device', `no pipeline finished compiling for ${this.timeoutMs} ms ` +
          `(${ready} of ${this._pipelines.length} ready)`, 'the GPU may be hung or overloaded; reload the page'));
      };
      watch = setTimeout(check, 250);
    });
    try {
      await Promise.race([p.promise, this._lost, stalled]);
    } finally {
      clearTimeout(watch);
    }
  }

  /** Resolves once every pipeline of the session is created, those of a start tier and of the variant
   * it starts (runs need not wait for it: each waits for the pipelines it reaches; after it, runs use
   * the variant's own kernels). Rejects as a run would on a stall or a rejected WGSL. */
  ready() {
    const result = this._queue.then(async () => { for (const p of this._pipelines) await this._reach(p); });
    this._queue = result.catch(() => {});
    return result;
  }

  /** The commands of a run reading back the outputs in `read` (names) at their shapes `dims(io)`, packed in
   * the readback buffer; a dynamic module's counts come from its registers `regs` (0 skips a dispatch). */
  _plan(tier, read, dims, regs) {
    const key = read.join('\0');
    let plan = regs ? null : tier.plans.get(key);
    if (!plan) {
      const items = [], readbacks = [];
      for (const it of tier.items) {
        const grid = regs && it.regs?.map((r) => regs[r]);
        if (!grid) items.push(it);
        else if (Math.min(...grid) > 0) items.push({...it, grid});
      }
      let at = 0;
      for (const io of this.module.outputs) {
        if (!read.includes(io.name)) continue;
        const size = round4(4 * numel(dims(io)));
        readbacks.push({io, at});
        items.push({src: this.buffers[io.buffer], srcOffset: io.offset, dst: this.readback, dstOffset: at, size});
        at += size;
      }
      plan = {items, readbacks, size: at};
      if (!regs) tier.plans.set(key, plan);
    }
    return plan;
  }

  /** Check a GPU tensor fed as input `io`. */
  _checkGpuFeed(io, t) {
    const name = t._io?.name ?? '?';
    if (t._session !== this) fail('feed', `input '${io.name}' is GPU tensor '${name}' of another session`, 'a GPU tensor feeds only the session that made it; feed await tensor.getData() instead');
    if (t.location !== 'gpu-buffer') fail('feed', `input '${io.name}' is GPU tensor '${name}', which was disposed`, 'feed a GPU tensor before disposing it');
    const want = ONNX_TYPES[io.onnxType]?.[0];
    if (t.type !== want || t._io.dtype !== io.dtype) fail('feed', `input '${io.name}' must be ${want}, got GPU tensor '${name}' of ${t.type}`, `feed a tensor of type ${want}`);
    if (!io.dynamic && (t.dims.length !== io.dims.length || t.dims.some((d, i) => d !== io.dims[i]))) {
      fail('feed', `input '${io.name}' has shape ${show(t.dims)} (GPU tensor '${name}'); the model was compiled for ${show(io.dims)}`, 'feed exactly that shape');
    }
  }

  /** Read a GPU tensor back (Tensor.getData). */
  _download(t) {
    const result = this._queue.then(async () => {
      if (this._released) fail('device', 'the session was released', 'create a new session');
      if (t.location !== 'gpu-buffer') fail('feed', `tensor '${t._io.name}' was disposed`);
      const size = Math.max(round4(4 * t.size), 4);
      const staging = this.device.createBuffer({label: `read ${t._io.name}`, size, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST});
      try {
        const enc = this.device.createCommandEncoder();
        enc.copyBufferToBuffer(t.gpuBuffer, 0, staging, 0, size);
        this.device.queue.submit([enc.finish()]);
        await this._gpu(staging.mapAsync(GPUMapMode.READ), 'reading a GPU tensor (mapAsync)');
        const raw = new Uint8Array(staging.getMappedRange().slice(0));
        staging.unmap();
        return this._decode(t._io, raw, t.dims).data;
      } finally {
        staging.destroy();
      }
    });
    this._queue = result.catch(() => {});
    return result;
  }

  /** Check one feed and convert it to the kernels' 32-bit storage. */
  _encode(io, tensor) {
    const want = ONNX_TYPES[io.onnxType]?.[0];
    if (!tensor || typeof tensor !== 'object' || !('data' in tensor)) fail('feed', `input '${io.name}' must be a webiree.Tensor`);
    if (tensor.type !== want) fail('feed', `input '${io.name}' must be ${want}, got ${tensor.type}`, `convert it to ${want}`);
    const dims = Array.from(tensor.dims ?? [], Number);
    if (!io.dynamic && (dims.length !== io.dims.length || dims.some((d, i) => d !== io.dims[i]))) {   // else bindDims
      fail('feed', `input '${io.name}' has shape ${show(dims)}; the model was compiled for ${show(io.dims)}`,
        'feed exactly that shape, or rebuild with --input-shape');
    }
    const data = tensor.data;
    const n = numel(dims);
    const f16Array = io.onnxType === 10 && F16_ARRAY && data instanceof F16_ARRAY;
    if (!(data instanceof ONNX_TYPES[io.onnxType][1] || f16Array) || data.length !== n) {
      fail('feed', `input '${io.name}' has ${data?.length} ${data?.constructor?.name} elements; shape ${show(dims)} needs ${n} (${ONNX_TYPES[io.onnxType][1].name})`);
    }
    if (f16Array) return Float32Array.from(data);
    if (io.onnxType === 10) return Float32Array.from(data, f32OfF16Bits);
    if (io.onnxType === 16) return new Float32Array(Uint32Array.from(data, (b) => b << 16).buffer);
    if (io.dtype === 'f32') return data;
    if (io.dtype === 'bool') return Uint32Array.from(data, (v) => (v ? 1 : 0));
    if (data instanceof BigInt64Array) {  // narrow to i32: the high word must be the sign of the low word
      const words = new Int32Array(data.buffer, data.byteOffset, 2 * n);
      const out = new Int32Array(n);
      for (let i = 0; i < n; i++) {
        const lo = words[2 * i];
        if (words[2 * i + 1] !== lo >> 31) {
          fail('feed', `input '${io.name}' holds ${data[i]}, outside the int32 range WebGPU can compute with`,
            'int64 inputs are narrowed to int32; keep values within +-2^31');
        }
        out[i] = lo;
      }
      return out;
    }
    if (data instanceof BigUint64Array) {  // narrow to u32: the high word must be 0
      const words = new Uint32Array(data.buffer, data.byteOffset, 2 * n);
      const out = new Uint32Array(n);
      for (let i = 0; i < n; i++) {
        if (words[2 * i + 1] !== 0) {
          fail('feed', `input '${io.name}' holds ${data[i]}, outside the uint32 range WebGPU can compute with`,
            'uint64 inputs are narrowed to uint32; keep values below 2^32');
        }
        out[i] = words[2 * i];
      }
      return out;
    }
    return io.dtype === 'i32' ? Int32Array.from(data) : Uint32Array.from(data);
  }

  /** An output's storage bytes as a Tensor of its ONNX type, with `dims` (its run's shape). */
  _decode(io, bytes, dims = io.dims) {
    const [type, Cls] = ONNX_TYPES[io.onnxType] ?? ['float32', Float32Array];
    const n = numel(dims);
    const raw = io.dtype === 'f32' ? new Float32Array(bytes.buffer, bytes.byteOffset, n)
      : io.dtype === 'i32' ? new Int32Array(bytes.buffer, bytes.byteOffset, n) : new Uint32Array(bytes.buffer, bytes.byteOffset, n);
    let data;
    if (io.onnxType === 10 || io.onnxType === 16) {
      const bits = new Uint32Array(bytes.buffer, bytes.byteOffset, n);
      data = io.onnxType === 10 ? Uint16Array.from(bits, f16BitsOfF32Bits) : Uint16Array.from(bits, (u) => u >>> 16);
      if (io.onnxType === 10 && F16_ARRAY) data = new F16_ARRAY(data.buffer);   // the same bits, as halves
    } else if (Cls === BigInt64Array || Cls === BigUint64Array) data = Cls.from(raw, BigInt);
    else if (type === 'bool') data = Uint8Array.from(raw, (v) => (v ? 1 : 0));
    else data = Cls.from(raw);
    return new Tensor(type, data, dims);
  }

  /** Run the model. feeds: {inputName: Tensor}; options: {profile: true} adds results.profile;
   * {keep: [output names]} leaves those outputs on the GPU: they come back as Tensors with
   * location 'gpu-buffer' (await t.getData() reads one, t.dispose() frees it) and can be fed to a
   * later run of this session, copied on the GPU into the input (copyBufferToBuffer). */
  run(feeds, options = {}) {
    const result = this._queue.then(() => {
      const running = this._run(feeds, options).finally(() => { if (this._running === settled) this._running = null; });
      const settled = running.then(() => {}, () => {});
      this._running = settled;   // what _upgrade waits for
      return running;
    });
    this._queue = result.catch(() => {});
    return result;
  }

  async _run(feeds, options) {
    if (this._released) fail('device', 'the session was released', 'create a new session');
    if (this._lostError) throw this._lostError;
    if (this._gpuErrors.length) fail('device', `WebGPU reported an error: ${this._gpuErrors.splice(0).join('; ')}`);
    const {module: m, device: d} = this;
    if (!feeds || typeof feeds !== 'object') fail('feed', 'feeds must be an object {input name: Tensor}');
    const unknown = Object.keys(feeds).filter((k) => !this.inputNames.includes(k));
    if (unknown.length) fail('feed', `unknown input name(s) ${JSON.stringify(unknown)}`, `the model's inputs are ${JSON.stringify(this.inputNames)}`);
    const missing = this.inputNames.filter((k) => !(k in feeds));
    if (missing.length) fail('feed', `missing input(s) ${JSON.stringify(missing)}`, `the model's inputs are ${JSON.stringify(this.inputNames)}`);
    const keep = [...new Set(options.keep ?? [])];
    const badKeep = keep.filter((k) => !this.outputNames.includes(k));
    if (badKeep.length) fail('feed', `keep names unknown output(s) ${JSON.stringify(badKeep)}`, `the model's outputs are ${JSON.stringify(this.outputNames)}`);
    const wanted = options.outputs ? [...new Set(options.outputs)] : this.outputNames;
    const badOut = wanted.filter((k) => !this.outputNames.includes(k));
    if (badOut.length) fail('feed', `unknown output name(s) ${JSON.stringify(badOut)}`, `the model's outputs are ${JSON.stringify(this.outputNames)}`);
    const unwanted = keep.filter((k) => !wanted.includes(k));
    if (unwanted.length) fail('feed', `keep names ${JSON.stringify(unwanted)}, not among the outputs returned`, `keep names outputs that run returns (${JSON.stringify(wanted)})`);
    const onGpu = (t) => t instanceof Tensor && t.location !== 'cpu';
    const encoded = m.inputs.map((io) => {
      const t = feeds[io.name];
      if (onGpu(t)) { this._checkGpuFeed(io, t); return t; }
      return this._encode(io, t);
    });
    // a dynamic module: this run's sizes, from the fed dims (checked against the ranges)
    const tier = this._startTier ?? this._tier;
    const regs = this.dynamic ? bindDims(tier.view, m.inputs.map((io) => Array.from(feeds[io.name].dims ?? [], Number))) : null;
    const dimsOf = (io) => (regs ? shapeOf(io, regs) : io.dims);
    const plan = this._plan(tier, wanted.filter((n) => !keep.includes(n)), dimsOf, regs);
    const dispatches = plan.items.filter((it) => it.bindGroup);

    d.pushErrorScope('validation');
    let enc = d.createCommandEncoder();
    for (const i of this.uploads) {
      const io = m.inputs[i];
      if (onGpu(encoded[i])) {   // copied on the GPU into the input's place, before the dispatches
        const size = round4(4 * numel(dimsOf(io)));
        if (size) enc.copyBufferToBuffer(encoded[i].gpuBuffer, 0, this.buffers[io.buffer], io.offset, size);
      } else if (encoded[i].byteLength) {   // this run's bytes only
        d.queue.writeBuffer(this.buffers[io.buffer], io.offset, encoded[i]);
      }
    }
    if (regs) {   // the symbols' values, one i32 each, for the kernels to read their sizes from
      const words = Int32Array.from(m.symbols, (_, k) => regs[k]);
      for (const b of this.params) d.queue.writeBuffer(b, 0, words);
    }
    const profile = options.profile && this.hasTimestamps && dispatches.length > 0;
    if (profile && !this._query) {
      const n = 2 * this.dispatchCount;
      this._query = d.createQuerySet({type: 'timestamp', count: n});
      this._resolve = d.createBuffer({size: 8 * n, usage: GPUBufferUsage.QUERY_RESOLVE | GPUBufferUsage.COPY_SRC});
      this._times = d.createBuffer({size: 8 * n, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST});
    }
    let pass = null;
    let k = 0;
    for (const it of plan.items) {
      if (it.bindGroup) {
        if (!it.pipe.pipeline) {
          // a pipeline still compiling: what is recorded runs meanwhile, the rest after it
          pass?.end();
          pass = null;
          d.queue.submit([enc.finish()]);
          enc = d.createCommandEncoder();
          try {
            await this._reach(it.pipe);
          } catch (e) {
            await d.popErrorScope().catch(() => null);
            throw e;
          }
        }
        if (profile) {
          pass?.end();
          pass = enc.beginComputePass({timestampWrites: {querySet: this._query, beginningOfPassWriteIndex: 2 * k, endOfPassWriteIndex: 2 * k + 1}});
        } else if (!pass) {
          pass = enc.beginComputePass();
        }
        pass.setPipeline(it.pipe.pipeline);
        pass.setBindGroup(0, it.bindGroup);
        pass.dispatchWorkgroups(...it.grid);
        k++;
      } else {
        pass?.end();
        pass = null;
        enc.copyBufferToBuffer(it.src, it.srcOffset, it.dst, it.dstOffset, it.size);
      }
    }
    pass?.end();
    const results = {};
    for (const name of keep) {
      const io = m.outputs[this.outputNames.indexOf(name)];
      const dims = dimsOf(io);
      const size = round4(4 * numel(dims));
      const buffer = d.createBuffer({label: `kept ${name}`, size: Math.max(size, 4), usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST});
      if (size) enc.copyBufferToBuffer(this.buffers[io.buffer], io.offset, buffer, 0, size);
      const t = gpuTensor(this, io, buffer, dims);
      this._resident.add(t);
      results[name] = t;
    }
    if (profile) {
      enc.resolveQuerySet(this._query, 0, 2 * dispatches.length, this._resolve, 0);
      enc.copyBufferToBuffer(this._resolve, 0, this._times, 0, 16 * dispatches.length);
    }
    d.queue.submit([enc.finish()]);
    const [error] = await Promise.all([
      this._gpu(d.popErrorScope(), 'popErrorScope()'),
      plan.size ? this._gpu(this.readback.mapAsync(GPUMapMode.READ, 0, plan.size), 'reading the results (mapAsync)') : null,
      profile ? this._gpu(this._times.mapAsync(GPUMapMode.READ), 'reading the timestamps (mapAsync)') : null]);
    let raw = new Uint8Array(0);
    if (plan.size) {
      raw = new Uint8Array(this.readback.getMappedRange(0, plan.size).slice(0));
      this.readback.unmap();
    }
    this.lastReadbackBytes = plan.size;
    if (error) {
      for (const name of keep) results[name].dispose();
      fail('device', `WebGPU rejected a command: ${error.message}`);
    }
    for (const {io, at} of plan.readbacks) {
      const dims = dimsOf(io);
      results[io.name] = this._decode(io, raw.subarray(at, at + 4 * numel(dims)), dims);
    }
    if (profile) {   // the dispatches this run recorded (a dynamic module skips those with a count of 0)
      const ts = new BigInt64Array(this._times.getMappedRange().slice(0));
      this._times.unmap();
      this.profile = dispatches.map((it, i) => ({name: it.name, ms: Number(ts[2 * i + 1] - ts[2 * i]) / 1e6}));
      const info = {...this.module.info, dispatches: dispatches.map((it) => it.info)};
      Object.defineProperty(results, 'profile', {value: this.profile, enumerable: false, configurable: true});
      Object.defineProperty(results, 'trace', {value: chromeTrace(info, ts, dispatches.length),
                                               enumerable: false, configurable: true});
    }
    return results;
  }

  /** A GPU tensor for input `name` holding `tensor`'s data, written once (generation's constants). */
  _upload(name, tensor) {
    if (this._released) fail('device', 'the session was released', 'create a new session');
    const io = this.module.inputs[this.inputNames.indexOf(name)];
    const data = this._encode(io, tensor);
    const size = round4(data.byteLength);
    const buffer = this.device.createBuffer({label: `upload ${name}`, size: Math.max(size, 4),
      usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST});
    if (data.byteLength) this.device.queue.writeBuffer(buffer, 0, data);
    const t = gpuTensor(this, io, buffer, tensor.dims);
    this._resident.add(t);
    return t;
  }

  /**
   * Generate token ids with a decoder built with the generation head (`webiree build --generation`,
   * docs/generation.md), one step at a time: the KV cache stays on the GPU (present.* fed back as
   * past_key_values.*), the next token is picked on the GPU (argmax, or top-k sampling from a
   * seeded generator) and only its id (4 bytes) is read back. ids: the prompt's token ids. options:
   * {maxNewTokens, strategy: 'greedy' | 'top-k', k, seed, temperature, eosTokenId}. Yields each id as
   * it arrives; the GPU tensors are freed when it ends or the loop breaks.
   */
  async *generateStream(ids, options = {}) {
    const g = generationPlan(this, ids, options);
    const held = new Set(Object.values(g.constants));
    let feeds = g.first;
    try {
      for (let i = 0; i < g.maxNewTokens; i++) {
        const r = await this.run(feeds, {keep: g.keep, outputs: g.outputs});
        const token = Number(r[GEN.TOKEN].data[0]);
        for (const [name, t] of Object.entries(feeds)) {   // the last step's GPU inputs (not the constants)
          if (t.location === 'gpu-buffer' && name !== GEN.K && name !== GEN.TEMPERATURE) { t.dispose(); held.delete(t); }
        }
        for (const name of g.keep) held.add(r[name]);
        feeds = {[GEN.INPUT_IDS]: g.ids([token], [1, 1]), [GEN.K]: g.constants[GEN.K],
          [GEN.TEMPERATURE]: g.constants[GEN.TEMPERATURE], [GEN.RNG]: r[GEN.RNG_NEXT]};
        for (const p of g.past) feeds[p] = r[presentOf(p)];
        if (g.hasMask) feeds[GEN.ATTENTION_MASK] = r[GEN.MASK_NEXT];
        if (g.hasPos) feeds[GEN.POSITION_IDS] = r[GEN.POSITIONS_NEXT];
        yield token;
        if (options.eosTokenId !== undefined && options.eosTokenId !== null && token === options.eosTokenId) return;
      }
    } finally {
      for (const t of held) t.dispose();
    }
  }

  /** The new token ids (see generateStream); options.onToken(id, index) is called (and awaited) as each arrives. */
  async generate(ids, options = {}) {
    const out = [];
    for await (const token of this.generateStream(ids, options)) {
      out.push(token);
      await options.onToken?.(token, out.length - 1);
    }
    return out;
  }

  /** Destroy every GPU buffer and the device. The session cannot run afterwards. */
  async release() {
    if (this._released) return;
    await this._queue;
    if (!this._lostError) await this._gpu(this.device.queue.onSubmittedWorkDone(), 'onSubmittedWorkDone()').catch(() => {});
    this._released = true;
    for (const t of [...(this._resident ?? [])]) t.dispose();
    for (const b of [...(this.buffers ?? []), this.readback, this._resolve, this._times]) b?.destroy();
    this._query?.destroy();
    this.device.destroy();
  }
}
