// Type declarations of webiree.js, the webiree browser runtime.

export type TensorType = 'float32' | 'int64' | 'int32' | 'bool' | 'uint8' | 'int8' | 'uint16' | 'int16' |
  'uint32' | 'float64' | 'uint64' | 'float16' | 'bfloat16';

/** A Float16Array where the JavaScript engine has one (globalThis.Float16Array). */
export type Float16ArrayLike = Uint16Array | (typeof globalThis extends { Float16Array: new (...a: any[]) => infer F } ? F : never);

export interface TensorDataMap {
  float32: Float32Array; int64: BigInt64Array; int32: Int32Array; bool: Uint8Array; uint8: Uint8Array;
  int8: Int8Array; uint16: Uint16Array; int16: Int16Array; uint32: Uint32Array; float64: Float64Array;
  uint64: BigUint64Array;
  /** feeds: the halves' bits as a Uint16Array, or a Float16Array where the engine has one; outputs: a
   * Float16Array where the engine has one (globalThis.Float16Array), else a Uint16Array of the bits */
  float16: Float16ArrayLike;
  /** the bfloat16 bits (the upper halves of float32 values), in and out */
  bfloat16: Uint16Array;
}

export class Tensor<T extends TensorType = TensorType> {
  constructor(type: T, data: TensorDataMap[T] | number[] | bigint[], dims?: readonly number[]);
  constructor(data: TensorDataMap[T], dims?: readonly number[]);
  readonly type: T;
  readonly data: TensorDataMap[T];
  /** the shape; an output of a dynamic module has its run's shape */
  readonly dims: number[];
  readonly size: number;
  /** 'cpu' for tensors made with `new Tensor`; 'gpu-buffer' for an output kept on the GPU
   * (run(feeds, {keep})); 'none' once such a tensor is disposed. Reading `data` of a GPU tensor
   * throws: use getData(). */
  readonly location: 'cpu' | 'gpu-buffer' | 'none';
  /** the GPU tensor's own buffer (location 'gpu-buffer' only) */
  readonly gpuBuffer?: GPUBuffer;
  /** the data: at once for a CPU tensor, read back from the GPU for a GPU tensor */
  getData(): Promise<TensorDataMap[T]>;
  /** free a GPU tensor's buffer (session.release() frees them too); no-op for a CPU tensor */
  dispose(): void;
}

/** kind says what went wrong: the files, the feeds, the device, the device's limits, or a
 * tokenizer.json that tokenizer.js cannot read. */
export class WebireeError extends Error {
  readonly kind: 'model' | 'feed' | 'device' | 'limits' | 'tokenizer';
  readonly hint?: string;
}

export interface ValueMetadata {
  name: string;
  isTensor: true;
  type: TensorType;
  /** the declared shape: a number where the dim is fixed (the whole shape of a static build); in a
   * dynamic build (sizes in ranges) a varying dim is its symbol's name ('sequence'), or null where
   * it is computed from the symbols (as onnxruntime shows symbolic dims) */
  shape: (number | string | null)[];
}

export interface LoadProgress {
  /** bytes received so far, over manifest, module and weights together */
  loaded: number;
  total: number;
  /** the file the last chunk belonged to */
  file: string;
}

export interface SessionOptions {
  onProgress?: (progress: LoadProgress) => void;
  /** how long any one GPU operation may take before it fails, and how long pipeline creation
   * may go without any pipeline finishing (default 30000) */
  timeoutMs?: number;
  powerPreference?: 'low-power' | 'high-performance';
  /** keep the weights in the Cache API (cache WEIGHTS_CACHE, keyed by the manifest's content hash)
   * and read them from there on the next visit without a request for weights.bin; false never
   * reads nor stores them (default true; where the Cache API is missing, e.g. a non-secure
   * context, the weights are always downloaded). Downloaded or cached, the weights are verified
   * against the manifest's SHA-256 hashes. */
  cache?: boolean;
  /** run the session in a dedicated module Web Worker (worker.js, next to webiree.js), so that
   * loading, compiling and running leave the page's main thread free. The session has the same
   * API; feeds are copied once into transferred buffers, outputs come back transferred, errors
   * arrive as WebireeError of the same kind and message. Feeds must be CPU tensors and
   * run(feeds, {keep}) is refused; release() also terminates the worker. (default false) */
  worker?: boolean;
  /** the kernel variant to run ('gpu' or 'cpu') of a build that carries several (a default build);
   * left out, the adapter picks: 'cpu' on a fallback / CPU adapter (isFallbackAdapter, SwiftShader,
   * llvmpipe, lavapipe), else 'gpu'. A name the build lacks is a 'model' error. */
  variant?: string;
  /** false: run the variant's own kernels from the first run. Left out (true), a variant with a start
   * tier (a default build's 'cpu-sg4', which SwiftShader runs) runs the start tier's small kernels,
   * which compile several times faster, while its own pipelines are created one at a time between
   * runs, then switches to them (runningVariant says which runs next). */
  startTier?: boolean;
}

/** The name of the Cache API cache holding weights, one entry per content hash. */
export const WEIGHTS_CACHE: 'webiree-weights-v1';

export interface DispatchTime {
  name: string;
  ms: number;
}

/** A Chrome trace (Trace Event Format): open it in Perfetto or chrome://tracing. */
export interface ChromeTrace {
  traceEvents: Array<{name: string; ph: 'X' | 'M'; pid: number; tid: number; cat?: string; ts?: number;
    dur?: number; args: Record<string, unknown>}>;
  displayTimeUnit: 'ms';
}

export type Results = Record<string, Tensor> & {
  /** per-dispatch GPU time, only with run(feeds, {profile: true}) on an adapter with 'timestamp-query' */
  readonly profile?: DispatchTime[];
  /** the same run as a Chrome trace: one event per dispatch with the ONNX nodes it fused */
  readonly trace?: ChromeTrace;
};

export interface RunOptions {
  profile?: boolean;
  /** outputs to leave on the GPU: returned as Tensors with location 'gpu-buffer', not read
   * back; feed one to a later run of the same session and it is copied on the GPU */
  keep?: string[];
  /** the outputs to return (default: all); the others are neither read back nor kept. keep must
   * name some of these. */
  outputs?: string[];
}

/** generate() / generateStream() of a decoder built with the generation head (docs/generation.md). */
export interface GenerateOptions {
  /** how many tokens to generate (default 16); the prompt plus these must fit the build's ranges */
  maxNewTokens?: number;
  /** 'greedy' (argmax, the default) or 'top-k' (sampling among the k largest logits) */
  strategy?: 'greedy' | 'top-k';
  /** top-k's k (default 50), at most the build's top-k limit (`--generation N`, default 64) */
  k?: number;
  /** seeds top-k's generator (default 0): the same seed gives the same tokens, in every runtime */
  seed?: number;
  /** top-k's temperature (default 1), > 0 */
  temperature?: number;
  /** stop after generating this id (it is included) */
  eosTokenId?: number;
  /** generate(): called with each new id as it arrives (awaited when it returns a promise) */
  onToken?: (token: number, index: number) => void | Promise<void>;
}

export interface ScheduleModule {
  /** binding kind: 0 storage (read), 1 storage (written), 2 read-only storage (the params buffer) */
  executables: {name: string; entry: string; format: 'wgsl' | 'spirv'; workgroupSize: number[];
    bindings: {slot: number; kind: 0 | 1 | 2; writes: boolean}[]; code: Uint8Array}[];
  buffers: {kind: 'weights' | 'input' | 'arena' | 'params'; size: number; blobOffset: number; name: string}[];
  inputs: IOInfo[];
  outputs: IOInfo[];
  commands: unknown[][];
  registers: number;
  limits: Record<string, number>;
  info: Record<string, unknown>;
  /** a dynamic module's symbols (SYMS) with their declared ranges; symbol k is register k; [] when static */
  symbols: {name: string; min: number; max: number}[];
  /** kernel variants (VARS): each a command stream over the shared executables; [] when the build has one */
  variants: {name: string; rule: string; registers: number; commands: unknown[][]}[];
  /** the variant this module was cut to (selectVariant), '' if none */
  variant: string;
  /** that variant's start tier (its name ends in '-start') over the same executables, or null */
  start?: {name: string; registers: number; commands: unknown[][]; dispatches: Record<string, unknown>[]} | null;
}

/** 'cpu' for a fallback / CPU adapter, else 'gpu': the class of kernel variant it runs. */
export function adapterClass(adapter: GPUAdapter): 'cpu' | 'gpu';
/** The module cut to one kernel variant: `requested`, else the adapter's class's, else the first. */
export function selectVariant(module: ScheduleModule, adapter: GPUAdapter, requested?: string, startTier?: boolean): ScheduleModule;

export interface IOInfo {
  name: string; dtype: 'f32' | 'i32' | 'u32' | 'bool'; onnxType: number;
  /** size: bytes at the largest shape; dims: the largest shape (the shape itself where fixed) */
  buffer: number; offset: number; size: number; dims: number[];
  /** per dim, the register holding its size in a run (null: fixed); [] in a static entry */
  regs: (number | null)[];
  /** whether some dim varies */
  dynamic: boolean;
}

export class InferenceSession {
  /** Load the build folder at `url` (relative to the page) onto a new WebGPU device. */
  static create(url: string, options?: SessionOptions): Promise<InferenceSession>;
  readonly inputNames: string[];
  readonly outputNames: string[];
  readonly inputMetadata: ValueMetadata[];
  readonly outputMetadata: ValueMetadata[];
  /** whether run(feeds, {profile: true}) can time dispatches */
  readonly hasTimestamps: boolean;
  /** the last profile taken, or null */
  readonly profile: DispatchTime[] | null;
  readonly manifest: Record<string, unknown>;
  /** where this session's weights came from: the Cache API or the network */
  readonly weightsSource: 'cache' | 'network';
  /** the kernel variant running ('gpu', 'cpu'), picked by the adapter or options.variant; '' for a
   * build with one set of kernels */
  readonly variant: string;
  /** the kernel variant the next run uses: the start tier ('cpu-sg4-start') until every pipeline of
   * `variant` is created, then `variant` */
  readonly runningVariant: string;
  /** feeds may hold GPU tensors this session returned (run(feeds, {keep})) */
  run(feeds: Record<string, Tensor>, options?: RunOptions): Promise<Results>;
  /** Resolves once every pipeline is created. create() returns once the weights are on the GPU,
   * with the pipelines still compiling in order of first use; a run waits only for the pipelines
   * it reaches, so awaiting ready() is never needed (it moves that wait before the first run).
   * With a start tier, it also waits for the variant's own pipelines: runs after it use them. */
  ready(): Promise<void>;
  /** Generate token ids from a prompt's ids with a decoder built with the generation head: the KV
   * cache stays on the GPU, each token is picked there (argmax or seeded top-k), and per step only
   * its id (4 bytes) is read back. Resolves to the new ids. Not in a worker session. */
  generate(ids: ArrayLike<number>, options?: GenerateOptions): Promise<number[]>;
  /** The same as an async iterator of the new ids, one per step; breaking out of the loop frees
   * the generation's GPU tensors. */
  generateStream(ids: ArrayLike<number>, options?: GenerateOptions): AsyncGenerator<number, void, undefined>;
  /** bytes the last run read back from the GPU (kept outputs are not read; a dynamic module reads
   * its outputs at their sizes in that run) */
  readonly lastReadbackBytes?: number;
  /** true once the GPU device is lost (a driver reset, a GPU process crash, a background tab on
   * mobile): run() then fails with a WebireeError of kind 'device' until recover() succeeds.
   * false on a released session. */
  readonly lost: boolean;
  /** After a device loss: a new adapter and device with the same options, the limits checked
   * again, buffers, pipelines and bind groups recreated, and the weights loaded again (from the
   * Cache API when they were cached: no request for weights.bin). GPU tensors kept from earlier
   * runs are disposed. A no-op while the device is fine; rejects (kind 'device') on a released
   * session, or if no new device can run the model (then run() keeps failing; retry later). */
  recover(): Promise<void>;
  /** Destroy the session's GPU buffers and device. */
  release(): Promise<void>;
}

/** Parse a schedule module (model.wrm); throws WebireeError (kind 'model') if it is malformed. */
export function readModule(data: ArrayBuffer | Uint8Array): ScheduleModule;
