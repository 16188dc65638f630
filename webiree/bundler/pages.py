"""The pages of the text tasks (bundler/tasks.py), written as a site's index.html.

    text-embedding   EMBEDDING_HTML: two sentences -> tokenizer.js -> the encoder (one run per
                     sentence, batch 1) -> last_hidden_state read back -> mean over the attention
                     mask, L2-normalized, in JavaScript -> the first values of each embedding and
                     the cosine similarity of the two
    text-generation  GENERATION_HTML: a prompt -> tokenizer.js -> session.generateStream (each token
                     picked on the GPU, greedy or seeded top-k) -> each id decoded into the page as
                     it arrives, with the time to the first token and tokens/s

Both read what they need from the manifest's "task" (max_length, input and output names, top_k) and
the tokenizer from tokenizer.json; both say on the page how text becomes token ids (special tokens,
truncation). State for tests and scripts: `globalThis.webireeDemo`, and `document.body.dataset.state`
('loading', 'ready', 'running', 'done', 'error'). Relative URLs only.
"""

from __future__ import annotations

_HEAD = r"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>webiree: TITLE</title>
<link rel="icon" href="data:,">
<style>
  body { font: 15px/1.45 system-ui, sans-serif; max-width: 52rem; margin: 2rem auto; padding: 0 1rem; color: #222; }
  h1 { font-size: 1.4rem; } h2 { font-size: 1.1rem; margin-top: 1.5rem; }
  progress { width: 100%; height: 1rem; }
  label.block { display: block; margin-top: .6rem; font-weight: 600; }
  textarea { width: 100%; box-sizing: border-box; font: inherit; padding: .4rem; }
  .row > * { margin: .5rem 1rem .3rem 0; display: inline-block; } input[type=number] { width: 5rem; }
  button { font: inherit; padding: .3rem 1rem; margin-top: .6rem; }
  table { border-collapse: collapse; margin: .5rem 0; } td, th { padding: .2rem .6rem; border-bottom: 1px solid #ddd; text-align: left; vertical-align: top; }
  code { font-size: .9em; word-break: break-word; }
  .big { font-size: 1.3rem; } .muted { color: #666; } .error { color: #b00020; font-weight: 600; white-space: pre-wrap; }
  #text { font-size: 1.1rem; white-space: pre-wrap; border: 1px solid #ddd; padding: .6rem; min-height: 2.5rem; }
  #prompt-text { color: #666; } #generated { color: #0b4fa8; }
</style>
</head>
"""

_COMMON_JS = r"""
import * as webiree from './webiree.js';
import {Tokenizer} from './tokenizer.js';

const $ = (id) => document.getElementById(id);
const el = (tag, attrs = {}, ...kids) => { const e = Object.assign(document.createElement(tag), attrs); e.append(...kids); return e; };
const setState = (s) => { document.body.dataset.state = s; };
const ARRAYS = {int64: BigInt64Array, int32: Int32Array, float32: Float32Array, bool: Uint8Array};
const tensor = (type, values, dims) => new webiree.Tensor(type, ARRAYS[type] === BigInt64Array
  ? BigInt64Array.from(values, (v) => BigInt(v)) : ARRAYS[type].from(values), dims);

function showError(e) {
  demo.error = e;
  console.error(e);
  $('status').className = 'error';
  $('status').textContent = `Error: ${e.message}`;
  for (const b of document.querySelectorAll('button.go')) b.disabled = false;
  setState('error');
}

/** The session and the tokenizer, with a progress bar; checks the manifest names this page's task. */
async function load(taskName) {
  setState('loading');
  const progress = $('progress');
  const [session, tokenizer] = await Promise.all([
    webiree.InferenceSession.create('./', {onProgress: ({loaded, total, file}) => {
      progress.max = total || 1;
      progress.value = loaded;
      $('status').textContent = `Loading ${file}: ${(loaded / 1e6).toFixed(2)} of ${(total / 1e6).toFixed(2)} MB`;
    }}),
    Tokenizer.fromURL('./tokenizer.json')]);
  progress.value = progress.max;
  const task = session.manifest.task ?? {};
  if (task.name !== taskName) throw new Error(`this page is for ${taskName}; the manifest's task is ${JSON.stringify(task.name)}: rebuild the site`);
  $('model').textContent = `${session.manifest.model ?? 'model'}`;
  document.title = `webiree: ${session.manifest.model ?? 'model'} (${taskName})`;
  Object.assign(demo, {session, tokenizer, task});
  return demo;
}

/** The ids of `text` as the tokenizers library gives them with enable_truncation(max_length=max):
 * the special tokens the post-processor adds stay, the text's own tokens are cut from the end. */
function encodeTruncated(tokenizer, text, max) {
  const full = tokenizer.encode(text);
  if (full.ids.length <= max) return {ids: full.ids, tokens: full.tokens, typeIds: full.typeIds, length: full.ids.length};
  const body = tokenizer.encode(text, {addSpecialTokens: false}).ids;
  const extra = full.ids.length - body.length;        // what the post-processor added around the text
  let at = 0;                                         // where the text's tokens start
  while (at < extra && !body.every((id, i) => full.ids[at + i] === id)) at++;
  const keep = Math.max(0, max - extra);
  const cut = (a) => [...a.slice(0, at + keep), ...a.slice(at + body.length)];
  return {ids: cut(full.ids), tokens: cut(full.tokens), typeIds: cut(full.typeIds), length: full.ids.length};
}
"""

_FOOT = r"""<p class="muted">Runs entirely in this browser with WebGPU; the model was compiled ahead of time by webiree
  and the text is tokenized here by tokenizer.js. Files: <a href="manifest.json">manifest.json</a>,
  <a href="tokenizer.json">tokenizer.json</a>; <a href="generic.html">the generic page</a> (token ids in, tensors out).</p>
"""

EMBEDDING_HTML = _HEAD.replace("TITLE", "text embedding") + r"""<body>
<h1>Sentence embeddings: <span id="model">model</span></h1>
<p id="status">Loading…</p>
<progress id="progress" max="1" value="0"></progress>
<section id="controls" hidden>
  <label class="block" for="text-a">First sentence</label>
  <textarea id="text-a" rows="2">A man is playing a guitar on the stage.</textarea>
  <label class="block" for="text-b">Second sentence</label>
  <textarea id="text-b" rows="2">Someone plays music in front of a crowd.</textarea>
  <button id="embed" class="go" type="button">Compare</button> <span class="muted">(or Ctrl+Enter)</span>
</section>
<section id="result" hidden>
  <p class="big">Cosine similarity: <strong id="similarity">–</strong></p>
  <table><thead><tr><th></th><th>tokens</th><th>embedding (first values)</th></tr></thead>
    <tbody><tr><th>1</th><td id="tokens-a"></td><td><code id="values-a"></code></td></tr>
    <tr><th>2</th><td id="tokens-b"></td><td><code id="values-b"></code></td></tr></tbody></table>
  <p id="timing" class="muted"></p>
</section>
<h2>How text becomes an embedding</h2>
<p id="method" class="muted"></p>
""" + _FOOT + r"""<script type="module">""" + _COMMON_JS + r"""
const demo = globalThis.webireeDemo = {session: null, tokenizer: null, task: null, results: null, error: null, runs: 0};
const SHOWN = 8;

/** One sentence: token ids -> the model (batch 1) -> last_hidden_state -> mean over the mask, L2-normalized. */
async function embed(text) {
  const {session, tokenizer, task} = demo;
  const enc = encodeTruncated(tokenizer, text, task.max_length);
  const n = enc.ids.length;
  if (!n) throw new Error('this text has no tokens: type a sentence');
  const len = task.padded ? task.max_length : n;      // a build of fixed length: padded, masked out
  const padId = tokenizer.tokenToId('[PAD]') ?? 0;
  const mask = Array.from({length: len}, (_, i) => (i < n ? 1 : 0));
  const pad = (a, v) => Array.from({length: len}, (_, i) => (i < n ? a[i] : v));
  const type = Object.fromEntries(session.inputMetadata.map((m) => [m.name, m.type]));
  const names = task.inputs;
  const feeds = {[names.input_ids]: tensor(type[names.input_ids], pad(enc.ids, padId), [1, len])};
  if (names.attention_mask) feeds[names.attention_mask] = tensor(type[names.attention_mask], mask, [1, len]);
  if (names.token_type_ids) feeds[names.token_type_ids] = tensor(type[names.token_type_ids], pad(enc.typeIds, 0), [1, len]);
  const t0 = performance.now();
  const hidden = (await session.run(feeds, {outputs: [task.output]}))[task.output];
  const ms = performance.now() - t0;
  const width = hidden.dims[2], h = hidden.data;
  const sum = new Float64Array(width);
  let count = 0;
  for (let t = 0; t < len; t++) {
    if (!mask[t]) continue;
    count++;
    for (let j = 0; j < width; j++) sum[j] += h[t * width + j];
  }
  let norm = 0;
  for (let j = 0; j < width; j++) { sum[j] /= Math.max(count, 1e-9); norm += sum[j] * sum[j]; }
  norm = Math.max(Math.sqrt(norm), 1e-12);
  return {ids: enc.ids, tokens: enc.tokens, untruncated: enc.length, embedding: Array.from(sum, (v) => v / norm), ms};
}

async function compare() {
  setState('running');
  $('embed').disabled = true;
  $('status').className = '';
  $('status').textContent = 'Running…';
  const a = await embed($('text-a').value);
  const b = await embed($('text-b').value);
  const similarity = a.embedding.reduce((s, v, i) => s + v * b.embedding[i], 0);
  demo.results = {a, b, similarity};
  $('similarity').textContent = similarity.toFixed(4);
  for (const [key, r] of [['a', a], ['b', b]]) {
    const cut = r.untruncated > r.ids.length ? ` (cut from ${r.untruncated})` : '';
    $(`tokens-${key}`).replaceChildren(`${r.ids.length}${cut}: `, el('code', {}, r.tokens.slice(0, 24).join(' ') + (r.tokens.length > 24 ? ' …' : '')));
    $(`values-${key}`).textContent = r.embedding.slice(0, SHOWN).map((v) => v.toFixed(4)).join(', ') + ` … (${r.embedding.length} values)`;
  }
  $('timing').textContent = `Model runs: ${a.ms.toFixed(1)} ms and ${b.ms.toFixed(1)} ms (upload, run, read back last_hidden_state).`;
  $('result').hidden = false;
  $('status').textContent = 'Done: compared the two sentences.';
  $('embed').disabled = false;
  demo.runs++;
  setState('done');
}

async function main() {
  const {task, tokenizer} = await load('text-embedding');
  const specials = tokenizer.encode('').tokens;
  $('method').textContent = `Each sentence is encoded by tokenizer.js with this site's tokenizer.json, with the special tokens its ` +
    `post-processor adds (${specials.length ? specials.join(' … ') : 'none'}); a sentence of more than ${task.max_length} tokens ` +
    `(this build's longest sequence) is cut to ${task.max_length}: the text's last tokens are dropped and the special tokens stay, ` +
    `as the tokenizers library's enable_truncation(max_length=${task.max_length}) does. ${task.inputs.token_type_ids ? 'token_type_ids are 0. ' : ''}` +
    `The model runs once per sentence (batch 1${task.padded ? `, padded to ${task.max_length} with [PAD] and an attention mask of 0` : ', no padding'}); ` +
    `the embedding is the mean of ${task.output} over the attention mask, divided by its L2 norm (sentence-transformers' mean pooling), ` +
    `and the similarity is the dot product of the two embeddings (their cosine).`;
  $('embed').onclick = () => compare().catch(showError);
  for (const id of ['text-a', 'text-b']) $(id).onkeydown = (ev) => { if (ev.key === 'Enter' && (ev.ctrlKey || ev.metaKey)) $('embed').click(); };
  $('controls').hidden = false;
  $('status').textContent = 'Ready: type two sentences and press Compare.';
  setState('ready');
}

main().catch(showError);
</script>
</body>
</html>
"""

GENERATION_HTML = _HEAD.replace("TITLE", "text generation") + r"""<body>
<h1>Text generation: <span id="model">model</span></h1>
<p id="status">Loading…</p>
<progress id="progress" max="1" value="0"></progress>
<section id="controls" hidden>
  <label class="block" for="prompt">Prompt</label>
  <textarea id="prompt" rows="3">Once upon a time, the little robot</textarea>
  <div class="row">
    <label>New tokens <input type="number" id="max-new" value="32" min="1"></label>
    <label>Sampling <select id="strategy"><option value="greedy">greedy (argmax)</option><option value="top-k">top-k</option></select></label>
    <label>k <input type="number" id="k" value="8" min="1" disabled></label>
    <label>seed <input type="number" id="seed" value="0" disabled></label>
    <label id="eos-row" hidden><input type="checkbox" id="stop-eos" checked> stop at <code id="eos-token"></code></label>
  </div>
  <button id="generate" class="go" type="button">Generate</button>
  <button id="stop" type="button" disabled>Stop</button>
</section>
<section id="result" hidden>
  <p id="text"><span id="prompt-text"></span><span id="generated"></span></p>
  <p id="stats" class="muted"></p>
  <p class="muted">New token ids: <code id="token-ids" data-ids="[]"></code></p>
</section>
<h2>How the prompt becomes tokens</h2>
<p id="method" class="muted"></p>
""" + _FOOT + r"""<script type="module">""" + _COMMON_JS + r"""
const demo = globalThis.webireeDemo = {session: null, tokenizer: null, task: null, promptIds: null, ids: [], stats: null,
  error: null, runs: 0, stopRequested: false};
const EOS_NAMES = ['<|endoftext|>', '</s>', '<eos>', '<|end_of_text|>'];
const int = (id, fallback) => { const v = Math.floor(Number($(id).value)); return Number.isFinite(v) ? v : fallback; };

async function generate() {
  const {session, tokenizer, task} = demo;
  setState('running');
  $('generate').disabled = true;
  $('stop').disabled = false;
  $('status').className = '';
  demo.stopRequested = false;
  const maxNew = Math.min(Math.max(int('max-new', 32), 1), task.max_length - 1);
  $('max-new').value = maxNew;
  let ids = tokenizer.encode($('prompt').value).ids;
  if (!ids.length) throw new Error('the prompt has no tokens: type some text');
  const keep = Math.min(task.max_prompt, task.max_length - maxNew);
  const cut = Math.max(0, ids.length - keep);
  ids = ids.slice(cut);                     // too long for the build: keep the prompt's end
  const options = {maxNewTokens: maxNew};
  if ($('strategy').value === 'top-k') Object.assign(options, {strategy: 'top-k', k: int('k', 8), seed: int('seed', 0)});
  if (demo.eos !== undefined && $('stop-eos').checked) options.eosTokenId = demo.eos;
  demo.promptIds = ids;
  demo.ids = [];
  demo.options = options;
  const promptText = tokenizer.decode(ids);
  $('prompt-text').textContent = (cut ? '… ' : '') + promptText;
  $('generated').textContent = '';
  $('token-ids').textContent = '';
  $('token-ids').dataset.ids = '[]';
  $('result').hidden = false;
  $('status').textContent = `Generating up to ${maxNew} tokens after a prompt of ${ids.length}${cut ? ` (its first ${cut} dropped to fit the build)` : ''}…`;
  const t0 = performance.now();
  let first = null, last = null;
  for await (const id of session.generateStream(ids, options)) {
    last = performance.now();
    first ??= last;
    demo.ids.push(id);
    const full = tokenizer.decode([...ids, ...demo.ids]);
    $('generated').textContent = full.startsWith(promptText) ? full.slice(promptText.length) : tokenizer.decode(demo.ids);
    $('token-ids').textContent = demo.ids.join(' ');
    $('token-ids').dataset.ids = JSON.stringify(demo.ids);
    const n = demo.ids.length;
    demo.stats = {tokens: n, firstTokenMs: first - t0, totalMs: last - t0,
      tokensPerSecond: n > 1 ? (n - 1) / ((last - first) / 1000) : null};
    $('stats').textContent = `${n} token${n === 1 ? '' : 's'} in ${(last - t0).toFixed(0)} ms: the first after ${(first - t0).toFixed(0)} ms ` +
      `(the prompt's ${ids.length} tokens in one step)` + (n > 1 ? `, then ${demo.stats.tokensPerSecond.toFixed(1)} tokens/s` : '');
    if (demo.stopRequested) break;          // frees the generation's GPU tensors
  }
  $('status').textContent = demo.stopRequested ? 'Stopped.' : `Done: ${demo.ids.length} new tokens.`;
  $('generate').disabled = false;
  $('stop').disabled = true;
  demo.runs++;
  setState('done');
}

async function main() {
  const {task, tokenizer} = await load('text-generation');
  for (const name of EOS_NAMES) {
    const id = tokenizer.tokenToId(name);
    if (id !== undefined) { demo.eos = id; $('eos-token').textContent = name; $('eos-row').hidden = false; break; }
  }
  if (!task.top_k) {
    $('strategy').querySelector('option[value=top-k]').disabled = true;
  } else {
    $('k').max = task.top_k;
  }
  $('max-new').max = task.max_length - 1;
  $('strategy').onchange = () => { for (const id of ['k', 'seed']) $(id).disabled = $('strategy').value !== 'top-k'; };
  const specials = tokenizer.encode('').tokens;
  $('method').textContent = `The prompt is encoded by tokenizer.js with this site's tokenizer.json, with the special tokens its ` +
    `post-processor adds (${specials.length ? specials.join(', ') : 'none'}). The prompt and the new tokens together must fit this ` +
    `build's ${task.max_length} tokens (a prompt at most ${task.max_prompt}): a longer prompt keeps its last tokens. Each new token is ` +
    `picked on the GPU — greedy: the largest logit; top-k: sampled among the k largest (k up to ${task.top_k}) with a generator ` +
    `seeded by the seed, the same tokens in every runtime — and only its id is read back; the text shown is tokenizer.decode ` +
    `of the ids, special tokens left out. Tokens/s counts the steps after the first (which runs the whole prompt).`;
  $('generate').onclick = () => generate().catch(showError);
  $('stop').onclick = () => { demo.stopRequested = true; };
  $('prompt').onkeydown = (ev) => { if (ev.key === 'Enter' && (ev.ctrlKey || ev.metaKey)) $('generate').click(); };
  $('controls').hidden = false;
  $('status').textContent = 'Ready: type a prompt and press Generate.';
  setState('ready');
}

main().catch(showError);
</script>
</body>
</html>
"""

TASK_PAGES = {"text-embedding": EMBEDDING_HTML, "text-generation": GENERATION_HTML}
