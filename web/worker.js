// webiree's Web Worker: InferenceSession.create(url, {worker: true}) runs the session here, in a
// dedicated module worker, so the page's main thread does no loading, compiling nor decoding.
//
// Two halves in one file:
//  - in the page, createWorkerSession() starts `new Worker(worker.js, {type: 'module'})` and
//    returns a WorkerSession: the same API as an InferenceSession (inputNames, outputNames,
//    run(feeds) -> Tensors, release()), its calls sent as messages;
//  - in the worker, this module serves the messages create / run / release with webiree.js.
// Feeds are copied once into fresh buffers that are transferred; outputs come back transferred.
// Errors cross as {name, kind, message, hint} and are rethrown as WebireeError (same kind and message).

import {InferenceSession, Tensor, WebireeError} from './webiree.js';

const IN_WORKER = typeof WorkerGlobalScope !== 'undefined' && globalThis instanceof WorkerGlobalScope;

/** An error as a message: a WebireeError keeps its kind, message and hint. */
function packError(e) {
  return {name: e?.name ?? 'Error', kind: e?.kind ?? null, hint: e?.hint,
    message: String(e?.message ?? e)};
}

/** The error back from a message: a WebireeError of the same kind and message. */
function unpackError(p) {
  let e;
  if (p.kind) {
    e = new WebireeError(p.kind, p.message);
    e.hint = p.hint;
  } else {
    e = new Error(p.message);
    e.name = p.name;
  }
  return e;
}

/** Tensors as messages: {type, dims, data}; each data buffer goes into `transfer`. When `copy`,
 * the data is first copied into a buffer of its own (the caller's tensor stays usable). */
function packTensors(tensors, transfer, copy) {
  const out = {};
  for (const [name, t] of Object.entries(tensors)) {
    if (!(t instanceof Tensor)) throw new WebireeError('feed', `feed '${name}' is not a Tensor`);
    if (t.location !== 'cpu') {
      throw new WebireeError('feed', `feed '${name}' is a GPU tensor`, 'a worker session takes CPU tensors only');
    }
    let data = t.data;
    if (copy || data.byteOffset !== 0 || data.byteLength !== data.buffer.byteLength || transfer.includes(data.buffer)) {
      data = data.slice();
    }
    transfer.push(data.buffer);
    out[name] = {type: t.type, dims: t.dims, data};
  }
  return out;
}

const unpackTensors = (packed) => Object.fromEntries(Object.entries(packed)
  .map(([name, {type, dims, data}]) => [name, new Tensor(type, data, dims)]));

// ---------------------------------------------------------------- the page's side
let nextId = 1;

/** A session living in a Web Worker: the API of InferenceSession, minus GPU tensors (keep). */
export class WorkerSession {
  constructor(worker) {
    this.worker = worker;
    this._pending = new Map();
    this._released = false;
    this._onProgress = null;
    worker.onmessage = ({data: msg}) => {
      if (msg.progress) { this._onProgress?.(msg.progress); return; }
      const p = this._pending.get(msg.id);
      if (!p) return;
      this._pending.delete(msg.id);
      if (msg.error) p.reject(unpackError(msg.error));
      else p.resolve(msg.result);
    };
    const broken = (what) => {
      const err = new WebireeError('device', `the webiree worker failed: ${what}`, 'is worker.js served next to webiree.js?');
      for (const p of this._pending.values()) p.reject(err);
      this._pending.clear();
      this._broken = err;
    };
    worker.onerror = (e) => { e.preventDefault?.(); broken(e.message || 'it could not be loaded'); };
    worker.onmessageerror = () => broken('a message could not be deserialized');
  }

  _call(type, payload = {}, transfer = []) {
    if (this._broken) return Promise.reject(this._broken);
    const id = nextId++;
    return new Promise((resolve, reject) => {
      this._pending.set(id, {resolve, reject});
      this.worker.postMessage({id, type, ...payload}, transfer);
    });
  }

  /** Generation keeps the KV cache on the GPU between steps: not in a worker session. */
  async generate() {
    throw new WebireeError('feed', 'generate() is not available in a worker session', 'create the session without {worker: true} to generate');
  }

  // eslint-disable-next-line require-yield
  async *generateStream() {
    throw new WebireeError('feed', 'generateStream() is not available in a worker session', 'create the session without {worker: true} to generate');
  }

  /** Run with CPU tensors; the outputs come back as CPU tensors (their buffers transferred). */
  async run(feeds, options = {}) {
    if (this._released) throw new WebireeError('device', 'the session was released', 'create a new session');
    if (options.keep?.length) throw new WebireeError('feed', 'run(feeds, {keep}) is not available in a worker session', 'create the session without {worker: true} to keep outputs on the GPU');
    const transfer = [];
    const packed = packTensors(feeds ?? {}, transfer, true);
    const r = await this._call('run', {feeds: packed, options: {profile: !!options.profile}}, transfer);
    const results = unpackTensors(r.outputs);
    if (r.profile) {
      this.profile = r.profile;
      Object.defineProperty(results, 'profile', {value: r.profile, enumerable: false, configurable: true});
      Object.defineProperty(results, 'trace', {value: r.trace, enumerable: false, configurable: true});
    }
    this.lastReadbackBytes = r.lastReadbackBytes;
    this.runningVariant = r.runningVariant;
    return results;
  }

  /** Resolves once every pipeline is created in the worker (see InferenceSession.ready). */
  async ready() {
    if (this._released) throw new WebireeError('device', 'the session was released', 'create a new session');
    this.runningVariant = (await this._call('ready')).runningVariant;
  }

  /** Release the session in the worker, then terminate the worker. */
  async release() {
    if (this._released) return;
    this._released = true;
    try {
      if (!this._broken) await this._call('release');
    } finally {
      this.worker.terminate();
      for (const p of this._pending.values()) p.reject(new WebireeError('device', 'the session was released', 'create a new session'));
      this._pending.clear();
    }
  }
}

/** InferenceSession.create(url, {worker: true}): start the worker, create the session there. */
export async function createWorkerSession(url, options = {}) {
  const {onProgress, worker: _, ...rest} = options;
  const opts = Object.fromEntries(Object.entries(rest).filter(([, v]) => typeof v !== 'function'));
  // the worker resolves URLs against its own script: resolve against the page here
  const href = new URL(url.endsWith('/') ? url : `${url}/`, globalThis.location?.href).href;
  const worker = new Worker(new URL('./worker.js', import.meta.url), {type: 'module', name: 'webiree'});
  const session = new WorkerSession(worker);
  session._onProgress = onProgress ?? null;
  try {
    const info = await session._call('create', {url: href, options: opts});
    Object.assign(session, info);
  } catch (e) {
    session._released = true;
    worker.terminate();
    throw e;
  }
  return session;
}

// ---------------------------------------------------------------- the worker's side
if (IN_WORKER) {
  let session = null;
  const reply = (id, result, transfer = []) => globalThis.postMessage({id, result}, transfer);
  const handlers = {
    async create({url, options}) {
      session = await InferenceSession.create(url, {...options,
        onProgress: (progress) => globalThis.postMessage({progress})});
      const {inputNames, outputNames, inputMetadata, outputMetadata, hasTimestamps, manifest, weightsSource, variant, runningVariant} = session;
      return [{inputNames, outputNames, inputMetadata, outputMetadata, hasTimestamps, manifest, weightsSource, variant, runningVariant}];
    },
    async ready() {
      if (!session) throw new WebireeError('device', 'the session was released', 'create a new session');
      await session.ready();
      return [{runningVariant: session.runningVariant}];
    },
    async run({feeds, options}) {
      if (!session) throw new WebireeError('device', 'the session was released', 'create a new session');
      const results = await session.run(unpackTensors(feeds), options);
      const transfer = [];
      const outputs = packTensors(results, transfer, false);
      return [{outputs, profile: results.profile ?? null, trace: results.trace ?? null,
        lastReadbackBytes: session.lastReadbackBytes, runningVariant: session.runningVariant}, transfer];
    },
    async release() {
      const s = session;
      session = null;
      await s?.release();
      return [null];
    },
  };
  // messages are served one at a time, in order
  let queue = Promise.resolve();
  globalThis.onmessage = ({data: msg}) => {
    queue = queue.then(async () => {
      try {
        const [result, transfer] = await handlers[msg.type](msg);
        reply(msg.id, result, transfer);
      } catch (e) {
        globalThis.postMessage({id: msg.id, error: packError(e)});
      }
    });
  };
}
