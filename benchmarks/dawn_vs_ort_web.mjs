// webiree.js against onnxruntime-web's WebGPU EP on Dawn (the npm package `webgpu`, dawn.node) in
// one Node process: same adapter, same inputs, runs alternating between the two runtimes.
//   node benchmarks/dawn_vs_ort_web.mjs SPEC.json
// SPEC (written by benchmarks/dawn_vs_ort_web.py): {root, site, model, ortDir, webgpu, backend, featureLevel,
//   inputs: {name: {type, dims, file}}, runs, warmup, timeoutMs, outDir}
// `root` is served by node:http on loopback (webiree.js fetches the site's module and weights from
// it, onnxruntime-web the .onnx file); onnxruntime-web's own files load from `ortDir` (its WebGPU
// bundle and the asyncify wasm, one wasm thread). Writes outDir/result.json: per runtime the
// session create time, first run, median and fastest run (ms), and each output's bytes
// (outDir/<runtime>-<i>.bin) for the Python driver to check against onnxruntime CPU.
import {createServer} from 'node:http';
import {readFileSync, writeFileSync, mkdirSync, statSync} from 'node:fs';
import {join, normalize, extname} from 'node:path';
import {pathToFileURL} from 'node:url';

const spec = JSON.parse(readFileSync(process.argv[2], 'utf8'));
mkdirSync(spec.outDir, {recursive: true});
const timeoutMs = spec.timeoutMs ?? 120000;
const done = (obj) => { writeFileSync(join(spec.outDir, 'result.json'), JSON.stringify(obj)); };
const watchdog = setTimeout(() => { done({error: `no result within ${4 * timeoutMs} ms`}); process.exit(3); },
  4 * timeoutMs);
const within = (p, what) => Promise.race([p, new Promise((_, no) =>
  setTimeout(() => no(new Error(`${what} did not finish within ${timeoutMs} ms`)), timeoutMs))]);

const ARRAYS = {float32: Float32Array, int32: Int32Array, int64: BigInt64Array, uint8: Uint8Array,
  bool: Uint8Array, int8: Int8Array, float16: Uint16Array};
const TYPES = {'.json': 'application/json', '.wrm': 'application/octet-stream', '.bin': 'application/octet-stream',
  '.onnx': 'application/octet-stream', '.js': 'text/javascript', '.mjs': 'text/javascript'};

function serve(root) {
  const server = createServer((req, res) => {
    const path = normalize(join(root, decodeURIComponent(new URL(req.url, 'http://x').pathname)));
    if (!path.startsWith(normalize(root))) { res.writeHead(403).end(); return; }
    try {
      if (!statSync(path).isFile()) throw new Error('not a file');
      res.writeHead(200, {'content-type': TYPES[extname(path)] ?? 'application/octet-stream'});
      res.end(readFileSync(path));
    } catch { res.writeHead(404).end(); }
  });
  return new Promise((ok) => server.listen(0, '127.0.0.1', () => ok(server)));
}

const median = (xs) => { const s = [...xs].sort((a, b) => a - b); const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2; };

try {
  const {create, globals} = await import(pathToFileURL(spec.webgpu).href);
  Object.assign(globalThis, globals);
  const gpu = create([`backend=${spec.backend ?? 'vulkan'}`]);
  // the feature level ('compatibility': Dawn's OpenGL ES backend, as over this machine's llvmpipe)
  const requestAdapter = gpu.requestAdapter.bind(gpu);
  const facade = {requestAdapter: (o = {}) => requestAdapter({...o, featureLevel: spec.featureLevel ?? 'core'}),
    getPreferredCanvasFormat: () => 'rgba8unorm', wgslLanguageFeatures: gpu.wgslLanguageFeatures};
  Object.defineProperty(globalThis, 'navigator', {value: {gpu: facade, userAgent: 'node'}, configurable: true, writable: true});
  const server = await serve(spec.root);
  const base = `http://127.0.0.1:${server.address().port}/`;
  const feedsRaw = Object.fromEntries(Object.entries(spec.inputs).map(([name, {type, dims, file}]) => {
    const b = readFileSync(file);
    return [name, {type, dims, data: new ARRAYS[type](b.buffer.slice(b.byteOffset, b.byteOffset + b.length))}];
  }));
  const out = {adapter: null, runtimes: {}};

  // webiree.js
  const webiree = await import(pathToFileURL(join(import.meta.dirname, '..', 'web', 'webiree.js')).href);
  let t0 = performance.now();
  const ws = await webiree.InferenceSession.create(base + spec.site + '/', {timeoutMs});
  const wCreate = performance.now() - t0;
  const wFeeds = Object.fromEntries(Object.entries(feedsRaw).map(([k, f]) => [k, new webiree.Tensor(f.type, f.data, f.dims)]));
  t0 = performance.now();
  const wOut = await within(ws.run(wFeeds), 'webiree run');
  const wFirst = performance.now() - t0;
  out.variant = ws.variant;
  const info = ws.device?.adapterInfo ?? {};
  out.adapter = `${info.vendor ?? ''} ${info.architecture ?? ''} ${info.description ?? ''}`.trim();

  const save = (tag, outs, names) => names.map((name, i) => {
    const t = outs[name];
    const file = join(spec.outDir, `${tag}-${i}.bin`);
    writeFileSync(file, new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength));
    return {name, type: t.type, dims: [...t.dims], file};
  });
  out.runtimes.webiree = {createMs: wCreate, firstRunMs: wFirst, outputs: save('webiree', wOut, Object.keys(wOut))};
  const runners = {webiree: () => ws.run(wFeeds)};
  const time = async (names) => {    // alternating turns of 10 runs, each after its own warm-up runs
    const times = Object.fromEntries(names.map((n) => [n, []]));
    for (let turn = 0; turn < Math.max(1, Math.round(spec.runs / 10)); turn++) {
      for (const name of names) {
        for (let i = 0; i < (spec.warmup ?? 3) + 10; i++) {
          const t = performance.now();
          await within(runners[name](), `${name} run`);
          if (i >= (spec.warmup ?? 3)) times[name].push(performance.now() - t);
        }
      }
    }
    for (const [name, ts] of Object.entries(times)) {
      Object.assign(out.runtimes[name], {medianMs: median(ts), minMs: Math.min(...ts), runs: ts.length});
    }
  };
  await time(['webiree']);          // webiree alone first: its figures survive a failure of the other
  done(out);

  // onnxruntime-web, WebGPU EP, one wasm thread
  try {
    const ort = await import(pathToFileURL(join(spec.ortDir, 'ort.webgpu.min.mjs')).href);
    ort.env.wasm.wasmPaths = pathToFileURL(spec.ortDir + '/').href;
    ort.env.wasm.numThreads = 1;
    ort.env.logLevel = 'error';
    out.ortVersion = ort.env.versions?.web ?? ort.env.versions?.common;
    t0 = performance.now();
    const os = await within(ort.InferenceSession.create(new Uint8Array(readFileSync(join(spec.root, spec.model))),
      {executionProviders: ['webgpu']}), 'onnxruntime-web create');
    const oCreate = performance.now() - t0;
    const oFeeds = Object.fromEntries(Object.entries(feedsRaw).map(([k, f]) => [k, new ort.Tensor(f.type, f.data, f.dims)]));
    t0 = performance.now();
    const oOut = await within(os.run(oFeeds), 'onnxruntime-web run');
    out.runtimes.ort = {createMs: oCreate, firstRunMs: performance.now() - t0, outputs: save('ort', oOut, os.outputNames)};
    runners.ort = () => os.run(oFeeds);
    await time(['webiree', 'ort']);
    await os.release?.();
  } catch (e) {
    out.ortError = String(e?.message ?? e);
  }
  done(out);
  ws.release?.();
  server.close();
} catch (e) {
  done({error: String(e?.stack ?? e)});
}
clearTimeout(watchdog);
process.exit(0);
