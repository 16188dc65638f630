// Run a webiree build folder through web/webiree.js on Dawn (the npm package `webgpu`, dawn.node) in Node.
//   node tests/dawn/run_site.mjs SPEC.json
// SPEC: {url, backend: 'vulkan'|'opengles'|..., featureLevel: 'core'|'compatibility', timeoutMs,
//        inputs: {name: {type, dims, file}}, outDir, webgpu (optional path of the package)}
// Writes outDir/NAME.bin (raw little-endian data) and outDir/result.json ({outputs: {name: {type, dims, file}},
// adapter, limits}); on a failure result.json holds {error, kind}. Every WebGPU promise webiree.js awaits
// is under its own timeout (timeoutMs); the whole run is under a watchdog too.
import {readFileSync, writeFileSync, mkdirSync} from 'node:fs';
import {join} from 'node:path';
import {pathToFileURL} from 'node:url';

const spec = JSON.parse(readFileSync(process.argv[2], 'utf8'));
mkdirSync(spec.outDir, {recursive: true});
const result = (obj) => writeFileSync(join(spec.outDir, 'result.json'), JSON.stringify(obj));
const timeoutMs = spec.timeoutMs ?? 60000;
const watchdog = setTimeout(() => { result({error: `the run did not finish within ${4 * timeoutMs} ms`, kind: 'hang'}); process.exit(3); }, 4 * timeoutMs);

const ARRAYS = {float32: Float32Array, int32: Int32Array, int64: BigInt64Array, uint8: Uint8Array, bool: Uint8Array,
  int8: Int8Array, uint32: Uint32Array, float64: Float64Array, uint64: BigUint64Array, int16: Int16Array, uint16: Uint16Array};

let gpu;
try {
  const {create, globals} = await import(spec.webgpu ? pathToFileURL(spec.webgpu).href : 'webgpu');
  Object.assign(globalThis, globals);
  gpu = create([`backend=${spec.backend}`, ...(spec.dawnOptions ?? [])]);
  // webiree.js asks navigator.gpu for an adapter; pin the feature level here (compatibility mode)
  const requestAdapter = gpu.requestAdapter.bind(gpu);
  const facade = {requestAdapter: (o = {}) => requestAdapter({...o, featureLevel: spec.featureLevel ?? 'core'}),
    getPreferredCanvasFormat: () => 'rgba8unorm', wgslLanguageFeatures: gpu.wgslLanguageFeatures};
  Object.defineProperty(globalThis, 'navigator', {value: {gpu: facade}, configurable: true, writable: true});
  const webiree = await import(pathToFileURL(join(import.meta.dirname, '..', '..', 'web', 'webiree.js')).href);
  const session = await webiree.InferenceSession.create(spec.url, {timeoutMs});
  const feeds = {};
  for (const [name, {type, dims, file}] of Object.entries(spec.inputs)) {
    const bytes = readFileSync(file);
    const buf = bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.length);
    feeds[name] = new webiree.Tensor(type, new ARRAYS[type](buf), dims);
  }
  const outs = await session.run(feeds);
  const outputs = {};
  for (const [name, t] of Object.entries(outs)) {
    const file = join(spec.outDir, `out${Object.keys(outputs).length}.bin`);
    writeFileSync(file, new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength));
    outputs[name] = {type: t.type, dims: [...t.dims], file};
  }
  const adapterInfo = session.device.adapterInfo ?? {};
  result({outputs, dispatches: session.dispatchCount,
    adapter: {vendor: adapterInfo.vendor, architecture: adapterInfo.architecture, description: adapterInfo.description}});
  session.release?.();
} catch (e) {
  result({error: String(e?.stack ?? e), kind: e?.kind ?? 'exception'});
}
clearTimeout(watchdog);
gpu = null;
process.exit(0);
