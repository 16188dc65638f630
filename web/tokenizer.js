// tokenizer.js: Hugging Face tokenizers (tokenizer.json) in the browser. One dependency-free ES module.
//
// Reads the normalizer, pre_tokenizer, model, post_processor, decoder and added_tokens
// sections of a tokenizer.json and gives the same ids and offsets as the `tokenizers`
// library for the BERT family (BertNormalizer, BertPreTokenizer, WordPiece,
// BertProcessing / TemplateProcessing) and the GPT-2 family (ByteLevel, BPE):
//
//   import {Tokenizer} from './tokenizer.js';
//   const tok = await Tokenizer.fromURL('./tokenizer.json');
//   const enc = tok.encode('Hello world');   // {ids, tokens, offsets, attentionMask, typeIds, ...}
//   tok.decode(enc.ids);                     // 'hello world'
//
// Offsets count Unicode code points of the input (as the library reports them to Python);
// toUTF16Offsets turns them into JavaScript string indexes for highlighting.
//
// Text is held as a list of code points, each with the [start, end) range of the input it
// came from (its alignment). Every step keeps the alignments the way the library's
// NormalizedString does: a replaced character keeps its own, an inserted one takes the
// one of the character before it, a removed one is gone.

import {WebireeError} from './webiree.js';

export {WebireeError};

const fail = (message, hint) => { throw new WebireeError('tokenizer', message, hint); };
const unsupported = (section, type) => fail(`tokenizer.json: ${section} of type '${type}' is not supported`,
  'supported: normalizer BertNormalizer, Lowercase, StripAccents, NFD, NFKD, Sequence; pre_tokenizer ' +
  'BertPreTokenizer, ByteLevel, WhitespaceSplit, Sequence; model WordPiece, BPE; post_processor ' +
  'BertProcessing, RobertaProcessing, TemplateProcessing, ByteLevel, Sequence; decoder WordPiece, ByteLevel');

// ---------------------------------------------------------------- character classes
// The library's BERT normalizer and pre-tokenizer take "control" (Cc, Cf, Co), "nonspacing mark"
// (Mn) and "punctuation" (P) from the unicode_categories crate, whose tables are older than
// today's Unicode: \p{Mn} in a current browser would strip marks the library keeps. These are
// its tables, probed from tokenizers 0.23 (hex code point ranges; ASCII punctuation is added
// in code). Whitespace is Rust's char::is_whitespace, which is Unicode's White_Space.
function ranges(text) {
  const flat = [];
  for (const r of text.split(',')) {
    const [a, b = a] = r.split('-');
    flat.push(parseInt(a, 16), parseInt(b, 16));
  }
  return Int32Array.from(flat);
}
function inRanges(table, x) {
  let lo = 0, hi = table.length / 2 - 1;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1;
    if (x < table[2 * mid]) hi = mid - 1;
    else if (x > table[2 * mid + 1]) lo = mid + 1;
    else return true;
  }
  return false;
}
const CONTROL = ranges(
  '1-8,b-c,e-1f,7f-9f,ad,600-605,61c,6dd,70f,180e,200b-200f,202a-202e,2060-2064,2066-206f,e000-f8ff,feff,ff' +
  'f9-fffb,110bd,1bca0-1bca3,1d173-1d17a,e0001,e0020-e007f,f0000-ffffd,100000-10fffd');
const MARK_NONSPACING = ranges(
  '300-33f,342,345-36f,483-487,591-5bd,5bf,5c1-5c2,5c4-5c5,5c7,610-61a,64b-65f,670,6d6-6dc,6df-6e4,6e7-6e8,' +
  '6ea-6ed,711,730-74a,7a6-7b0,7eb-7f3,816-819,81b-823,825-827,829-82d,859-85b,8e3-902,93a,93c,941-948,94d,' +
  '951-957,962-963,981,9bc,9c1-9c4,9cd,9e2-9e3,a01-a02,a3c,a41-a42,a47-a48,a4b-a4d,a51,a70-a71,a75,a81-a82,' +
  'abc,ac1-ac5,ac7-ac8,acd,ae2-ae3,b01,b3c,b3f,b41-b44,b4d,b56,b62-b63,b82,bc0,bcd,c00,c3e-c40,c46-c47,c4a-' +
  'c4d,c55-c56,c62-c63,c81,cbc,cbf,cc6,ccc-ccd,ce2-ce3,d01,d41-d44,d4d,d62-d63,dca,dd2-dd4,dd6,e31,e34-e3a,' +
  'e47-e4e,eb1,eb4-eb9,ebb-ebc,ec8-ecd,f18-f19,f35,f37,f39,f71-f72,f74,f77,f79-f7e,f80,f82-f84,f86-f87,f8d-' +
  'f92,f94-f97,f99-f9c,f9e-fa1,fa3-fa6,fa8-fab,fad-fb8,fba-fbc,fc6,102d-1030,1032-1037,1039-103a,103d-103e,' +
  '1058-1059,105e-1060,1071-1074,1082,1085-1086,108d,109d,135d-135f,1712-1714,1732-1734,1752-1753,1772-1773' +
  ',17b4-17b5,17b7-17bd,17c6,17c9-17d3,17dd,180b-180d,18a9,1920-1922,1927-1928,1932,1939-193b,1a17-1a18,1a1' +
  'b,1a56,1a58-1a5e,1a60,1a62,1a65-1a6c,1a73-1a7c,1a7f,1ab0-1abd,1b00-1b03,1b34,1b36-1b3a,1b3c,1b42,1b6b-1b' +
  '73,1b80-1b81,1ba2-1ba5,1ba8-1ba9,1bab-1bad,1be6,1be8-1be9,1bed,1bef-1bf1,1c2c-1c33,1c36-1c37,1cd0-1cd2,1' +
  'cd4-1ce0,1ce2-1ce8,1ced,1cf4,1cf8-1cf9,1dc0-1df5,1dfc-1dff,20d0-20dc,20e1,20e5-20f0,2cef-2cf1,2d7f,2de0-' +
  '2dff,302a-302d,3099-309a,a66f,a674-a67d,a69e-a69f,a6f0-a6f1,a802,a806,a80b,a825-a826,a8c4,a8e0-a8f1,a926' +
  '-a92d,a947-a951,a980-a982,a9b3,a9b6-a9b9,a9bc,a9e5,aa29-aa2e,aa31-aa32,aa35-aa36,aa43,aa4c,aa7c,aab0,aab' +
  '2-aab4,aab7-aab8,aabe-aabf,aac1,aaec-aaed,aaf6,abe5,abe8,abed,fb1e,fe00-fe0f,fe20-fe2f,101fd,102e0,10376' +
  '-1037a,10a01-10a03,10a05-10a06,10a0c-10a0f,10a38-10a3a,10a3f,10ae5-10ae6,11001,11038-11046,1107f-11081,1' +
  '10b3-110b6,110b9-110ba,11100-11102,11127-1112b,1112d,11130-11134,11173,11180-11181,111b6-111be,111ca-111' +
  'cc,1122f-11231,11234,11236-11237,112df,112e3-112ea,11300-11301,1133c,11340,11366-1136c,11370-11374,114b3' +
  '-114b8,114ba,114bf-114c0,114c2-114c3,115b2-115b5,115bc-115bd,115bf-115c0,115dc-115dd,11633-1163a,1163d,1' +
  '163f-11640,116ab,116ad,116b0-116b5,116b7,1171d-1171f,11722-11725,11727-1172b,16af0-16af4,16b30-16b36,16f' +
  '8f-16f92,1bc9d-1bc9e,1d167-1d169,1d17b-1d182,1d185-1d18b,1d1aa-1d1ad,1d242-1d244,1da00-1da36,1da3b-1da6c' +
  ',1da75,1da84,1da9b-1da9f,1daa1-1daaf,1e8d0-1e8d6,e0100-e01ef');
const PUNCTUATION = ranges(
  'a1,a7,ab,b6-b7,bb,bf,37e,387,55a-55f,589-58a,5be,5c0,5c3,5c6,5f3-5f4,609-60a,60c-60d,61b,61e-61f,66a-66d' +
  ',6d4,700-70d,7f7-7f9,830-83e,85e,964-965,970,af0,df4,e4f,e5a-e5b,f04-f12,f14,f3a-f3d,f85,fd0-fd4,fd9-fda' +
  ',104a-104f,10fb,1360-1368,1400,166d-166e,169b-169c,16eb-16ed,1735-1736,17d4-17d6,17d8-17da,1800-180a,194' +
  '4-1945,1a1e-1a1f,1aa0-1aa6,1aa8-1aad,1b5a-1b60,1bfc-1bff,1c3b-1c3f,1c7e-1c7f,1cc0-1cc7,1cd3,2010-2027,20' +
  '30-2043,2045-2051,2053-205e,207d-207e,208d-208e,2308-230b,2329-232a,2768-2775,27c5-27c6,27e6-27ef,2983-2' +
  '998,29d8-29db,29fc-29fd,2cf9-2cfc,2cfe-2cff,2d70,2e00-2e2e,2e30-2e42,3001-3003,3008-3011,3014-301f,3030,' +
  '303d,30a0,30fb,a4fe-a4ff,a60d-a60f,a673,a67e,a6f2-a6f7,a874-a877,a8ce-a8cf,a8f8-a8fa,a8fc,a92e-a92f,a95f' +
  ',a9c1-a9cd,a9de-a9df,aa5c-aa5f,aade-aadf,aaf0-aaf1,abeb,fd3e-fd3f,fe10-fe19,fe30-fe52,fe54-fe61,fe63,fe6' +
  '8,fe6a-fe6b,ff01-ff03,ff05-ff0a,ff0c-ff0f,ff1a-ff1b,ff1f-ff20,ff3b-ff3d,ff3f,ff5b,ff5d,ff5f-ff65,10100-1' +
  '0102,1039f,103d0,1056f,10857,1091f,1093f,10a50-10a58,10a7f,10af0-10af6,10b39-10b3f,10b99-10b9c,11047-110' +
  '4d,110bb-110bc,110be-110c1,11140-11143,11174-11175,111c5-111c9,111cd,111db,111dd-111df,11238-1123d,112a9' +
  ',114c6,115c1-115d7,11641-11643,1173c-1173e,12470-12474,16a6e-16a6f,16af5,16b37-16b3b,16b44,1bc9f,1da87-1' +
  'da8b');
const IS_SPACE = /^\p{White_Space}$/u;
const IS_WORD = /^[\p{L}\p{N}\p{M}\p{Pc}]$/u;
const isControl = (c) => c !== '\t' && c !== '\n' && c !== '\r' && inRanges(CONTROL, c.codePointAt(0));
const isMarkNonspacing = (c) => inRanges(MARK_NONSPACING, c.codePointAt(0));
const isBertPunct = (c) => /^[!-\/:-@\[-`{-~]$/.test(c) || inRanges(PUNCTUATION, c.codePointAt(0));
const isSpace = (c) => IS_SPACE.test(c);

function isChinese(c) {
  const x = c.codePointAt(0);
  return (x >= 0x4E00 && x <= 0x9FFF) || (x >= 0x3400 && x <= 0x4DBF) || (x >= 0x20000 && x <= 0x2A6DF) ||
    (x >= 0x2A700 && x <= 0x2B73F) || (x >= 0x2B740 && x <= 0x2B81F) || (x >= 0x2B920 && x <= 0x2CEAF) ||
    (x >= 0xF900 && x <= 0xFAFF) || (x >= 0x2F800 && x <= 0x2FA1F);
}

// ---------------------------------------------------------------- aligned text
/** A run of code points, each with the [start, end) code point range of the input it came from. */
class Aligned {
  constructor(chars, starts, ends, at) {
    this.chars = chars; this.starts = starts; this.ends = ends;
    this.at = at;  // where an insertion before the first character points (the library's 0..0, shifted)
  }
  static of(text, from = 0) {
    const chars = Array.from(text);
    return new Aligned(chars, chars.map((_, i) => from + i), chars.map((_, i) => from + i + 1), from);
  }
  get length() { return this.chars.length; }
  get text() { return this.chars.join(''); }
  slice(a, b) {
    return new Aligned(this.chars.slice(a, b), this.starts.slice(a, b), this.ends.slice(a, b),
      a < this.length ? this.starts[a] : (this.length ? this.ends[this.length - 1] : this.at));
  }
  /** The input range [start, end) of characters a..b-1. */
  span(a, b) {
    if (a >= b) return a < this.length ? [this.starts[a], this.starts[a]] : [this.at, this.at];
    return [this.starts[a], this.ends[b - 1]];
  }
  /** Rebuild character by character: f(c, i) returns the replacement's code points (first
   * replaces c, the rest are inserted after it; [] removes c). */
  each(f) {
    const chars = [], starts = [], ends = [];
    this.chars.forEach((c, i) => {
      for (const d of f(c, i)) { chars.push(d); starts.push(this.starts[i]); ends.push(this.ends[i]); }
    });
    return new Aligned(chars, starts, ends, this.at);
  }
  /** Split at the ranges [a, b) given, keeping them and the gaps between, dropping empty pieces. */
  cut(ranges) {
    const out = [];
    let last = 0;
    for (const [a, b] of ranges) {
      if (a > last) out.push(this.slice(last, a));
      if (b > a) out.push(this.slice(a, b));
      last = b;
    }
    if (last < this.length) out.push(this.slice(last, this.length));
    return out;
  }
}

// ---------------------------------------------------------------- normalizers
function bertNormalizer(cfg) {
  const lowercase = cfg.lowercase ?? true;
  const stripAccents = cfg.strip_accents ?? lowercase;
  return (t) => {
    if (cfg.clean_text ?? true) {
      t = t.each((c) => (c === '\0' || c === '\uFFFD' || isControl(c)) ? [] : [isSpace(c) ? ' ' : c]);
    }
    if (cfg.handle_chinese_chars ?? true) {
      // the space before takes the alignment of the character before it (or the start)
      const chars = [], starts = [], ends = [];
      t.chars.forEach((c, i) => {
        if (isChinese(c)) {
          const [s, e] = i > 0 ? [t.starts[i - 1], t.ends[i - 1]] : [t.at, t.at];
          chars.push(' ', c, ' '); starts.push(s, t.starts[i], t.starts[i]); ends.push(e, t.ends[i], t.ends[i]);
        } else {
          chars.push(c); starts.push(t.starts[i]); ends.push(t.ends[i]);
        }
      });
      t = new Aligned(chars, starts, ends, t.at);
    }
    if (stripAccents) t = stripMarks(nfd(t, 'NFD'));
    if (lowercase) t = lower(t);
    return t;
  };
}
const nfd = (t, form) => t.each((c) => Array.from(c.normalize(form)));
const stripMarks = (t) => t.each((c) => isMarkNonspacing(c) ? [] : [c]);
const lower = (t) => t.each((c) => Array.from(c.toLowerCase()));  // one code point at a time, as Rust's char::to_lowercase

function makeNormalizer(cfg) {
  if (!cfg) return (t) => t;
  switch (cfg.type) {
    case 'BertNormalizer': return bertNormalizer(cfg);
    case 'Lowercase': return lower;
    case 'StripAccents': return stripMarks;
    case 'NFD': return (t) => nfd(t, 'NFD');
    case 'NFKD': return (t) => nfd(t, 'NFKD');
    case 'Sequence': {
      const steps = cfg.normalizers.map(makeNormalizer);
      return (t) => steps.reduce((acc, f) => f(acc), t);
    }
    default: return unsupported('normalizer', cfg.type);
  }
}

// ---------------------------------------------------------------- pre-tokenizers
// Each takes a list of Aligned pieces and returns the next list (empty pieces dropped).

// GPT-2's split pattern; \s is Unicode White_Space as in the library's Oniguruma regex
const GPT2_SPLIT = /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\p{White_Space}\p{L}\p{N}]+|\p{White_Space}+(?!\P{White_Space})|\p{White_Space}+/gu;
const BYTE_TO_CHAR = (() => {
  const keep = (b) => (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  const table = new Array(256);
  let n = 0;
  for (let b = 0; b < 256; b++) table[b] = String.fromCodePoint(keep(b) ? b : 256 + n++);
  return table;
})();
const CHAR_TO_BYTE = new Map(BYTE_TO_CHAR.map((c, b) => [c, b]));
const utf8 = new TextEncoder();
const UTF8_DECODER = new TextDecoder('utf-8', {ignoreBOM: true});  // lossy, keeps a leading U+FEFF

/** Split each piece where `isDelimiter` holds: drop the delimiters or keep each as its own piece. */
function splitChars(pieces, isDelimiter, keep) {
  return pieces.flatMap((t) => {
    const ranges = [];
    t.chars.forEach((c, i) => { if (isDelimiter(c)) ranges.push([i, i + 1]); });
    return keep ? t.cut(ranges) : t.cut(ranges).filter((p) => !(p.length === 1 && isDelimiter(p.chars[0])));
  });
}

/** Code point ranges of a global regex's matches in the piece's text. */
function matchRanges(t, re) {
  const text = t.text, ranges = [];
  // code unit index -> code point index
  const cp = new Int32Array(text.length + 1);
  let k = 0;
  for (let i = 0; i < text.length; k++) {
    const w = text.codePointAt(i) > 0xFFFF ? 2 : 1;
    for (let j = 0; j < w; j++) cp[i + j] = k;
    i += w;
  }
  cp[text.length] = k;
  for (const m of text.matchAll(re)) ranges.push([cp[m.index], cp[m.index + m[0].length]]);
  return ranges;
}

function byteLevel(cfg) {
  const addPrefixSpace = cfg.add_prefix_space ?? true;
  const useRegex = cfg.use_regex ?? true;
  return (pieces) => {
    let out = pieces.map((t) => {
      if (!addPrefixSpace || t.length === 0 || t.chars[0] === ' ') return t;
      // the library's prepend: the space replaces the first character, which is inserted after it
      return new Aligned([' ', ...t.chars], [t.starts[0], ...t.starts], [t.ends[0], ...t.ends], t.at);
    });
    if (useRegex) out = out.flatMap((t) => t.cut(matchRanges(t, GPT2_SPLIT)));
    return out.map((t) => t.each((c) => Array.from(utf8.encode(c), (b) => BYTE_TO_CHAR[b])));
  };
}

function makePreTokenizer(cfg) {
  if (!cfg) return (pieces) => pieces;
  switch (cfg.type) {
    case 'BertPreTokenizer':
      return (pieces) => splitChars(splitChars(pieces, isSpace, false), isBertPunct, true);
    case 'WhitespaceSplit': return (pieces) => splitChars(pieces, isSpace, false);
    case 'ByteLevel': return byteLevel(cfg);
    case 'Sequence': {
      const steps = cfg.pretokenizers.map(makePreTokenizer);
      return (pieces) => steps.reduce((acc, f) => f(acc), pieces);
    }
    default: return unsupported('pre_tokenizer', cfg.type);
  }
}

// ---------------------------------------------------------------- models
// A model maps one piece's code points to tokens [id, value, start, end] (code point indexes in the piece).

class WordPiece {
  constructor(cfg) {
    this.vocab = new Map(Object.entries(cfg.vocab));
    this.unk = cfg.unk_token ?? '[UNK]';
    this.prefix = cfg.continuing_subword_prefix ?? '##';
    this.maxChars = cfg.max_input_chars_per_word ?? 100;
  }
  tokenize(chars) {
    const unk = () => [[this.vocab.get(this.unk) ?? fail(`WordPiece: the unk_token '${this.unk}' is not in the vocabulary`),
      this.unk, 0, chars.length]];
    if (chars.length > this.maxChars) return unk();
    const out = [];
    for (let start = 0; start < chars.length;) {
      let end = chars.length, found = null;
      for (; end > start; end--) {
        const sub = (start > 0 ? this.prefix : '') + chars.slice(start, end).join('');
        const id = this.vocab.get(sub);
        if (id !== undefined) { found = [id, sub, start, end]; break; }
      }
      if (!found) return unk();
      out.push(found);
      start = end;
    }
    return out;
  }
}

const PAIR = 2 ** 26;  // pair key = left id * PAIR + right id (exact below 2^53)

/** A binary min-heap of merges ordered by (rank, position), as the library orders them. */
class MergeHeap {
  constructor() { this.items = []; }
  static less(a, b) { return a[0] < b[0] || (a[0] === b[0] && a[1] < b[1]); }
  push(rank, pos, id) {
    const h = this.items;
    h.push([rank, pos, id]);
    for (let i = h.length - 1; i > 0;) {
      const p = (i - 1) >> 1;
      if (!MergeHeap.less(h[i], h[p])) break;
      [h[i], h[p]] = [h[p], h[i]];
      i = p;
    }
  }
  pop() {
    const h = this.items;
    if (!h.length) return null;
    const top = h[0], last = h.pop();
    if (h.length) {
      h[0] = last;
      for (let i = 0; ;) {
        const l = 2 * i + 1, r = l + 1;
        let m = i;
        if (l < h.length && MergeHeap.less(h[l], h[m])) m = l;
        if (r < h.length && MergeHeap.less(h[r], h[m])) m = r;
        if (m === i) break;
        [h[i], h[m]] = [h[m], h[i]];
        i = m;
      }
    }
    return top;
  }
}

class BPE {
  constructor(cfg) {
    if (cfg.dropout) fail('tokenizer.json: BPE with dropout is not supported (it is random)');
    this.vocab = new Map(Object.entries(cfg.vocab));
    this.unk = cfg.unk_token ?? null;
    this.prefix = cfg.continuing_subword_prefix ?? '';
    this.suffix = cfg.end_of_word_suffix ?? '';
    this.fuseUnk = !!cfg.fuse_unk;
    this.byteFallback = !!cfg.byte_fallback;
    this.ignoreMerges = !!cfg.ignore_merges;
    this.merges = new Map();  // idA * PAIR + idB -> [rank, new id]
    cfg.merges.forEach((m, rank) => {
      const [a, b] = typeof m === 'string' ? m.split(' ') : m;
      const ia = this.vocab.get(a), ib = this.vocab.get(b);
      const merged = this.vocab.get(a + (this.prefix && b.startsWith(this.prefix) ? b.slice(this.prefix.length) : b));
      if (ia === undefined || ib === undefined || merged === undefined || ia >= PAIR || ib >= PAIR) {
        fail(`tokenizer.json: BPE merge '${a} ${b}' uses a token that is not in the vocabulary`);
      }
      this.merges.set(ia * PAIR + ib, [rank, merged]);
    });
    this.cache = new Map();
  }
  tokenize(chars) {
    if (chars.length === 0) return [];
    const word = chars.join('');
    let hit = this.cache.get(word);
    if (!hit) {
      hit = this.merge(chars);
      if (this.cache.size < 10000) this.cache.set(word, hit);
    }
    return hit;
  }
  merge(chars) {
    if (this.ignoreMerges && this.vocab.has(chars.join(''))) return [[this.vocab.get(chars.join('')), chars.join(''), 0, chars.length]];
    // symbols: [id, start, end]
    let syms = [];
    let unk = null;
    const unkId = () => this.vocab.get(this.unk) ?? fail(`BPE: the unk_token '${this.unk}' is not in the vocabulary`);
    chars.forEach((c, i) => {
      const s = (i > 0 ? this.prefix : '') + c + (i === chars.length - 1 ? this.suffix : '');
      const id = this.vocab.get(s);
      if (id !== undefined) {
        if (unk) { syms.push(unk); unk = null; }
        syms.push([id, i, i + 1]);
        return;
      }
      if (this.byteFallback) {
        const ids = Array.from(utf8.encode(s),
          (b) => this.vocab.get(`<0x${b.toString(16).toUpperCase().padStart(2, '0')}>`));
        if (ids.every((x) => x !== undefined)) {
          if (unk) { syms.push(unk); unk = null; }
          ids.forEach((x) => syms.push([x, i, i + 1]));
          return;
        }
      }
      if (this.unk !== null) {
        if (unk && this.fuseUnk) unk[2] = i + 1;
        else { if (unk) syms.push(unk); unk = [unkId(), i, i + 1]; }
      }
    });
    if (unk) syms.push(unk);
    return this.mergeAll(syms);
  }
  /** Merge the adjacent pair of lowest rank (leftmost first) until none is left. */
  mergeAll(syms) {
    // a linked list of symbols and a heap of candidate merges [rank, pos, new id]; stale entries are skipped
    const n = syms.length, next = new Int32Array(n), prev = new Int32Array(n), alive = new Uint8Array(n).fill(1);
    for (let i = 0; i < n; i++) { next[i] = i + 1 < n ? i + 1 : -1; prev[i] = i - 1; }
    const heap = new MergeHeap();
    const consider = (i) => {
      if (i < 0 || next[i] < 0) return;
      const m = this.merges.get(syms[i][0] * PAIR + syms[next[i]][0]);
      if (m) heap.push(m[0], i, m[1]);
    };
    for (let i = 0; i + 1 < n; i++) consider(i);
    for (let top; (top = heap.pop());) {
      const [, pos, id] = top;
      if (!alive[pos] || next[pos] < 0) continue;
      const right = next[pos];
      const m = this.merges.get(syms[pos][0] * PAIR + syms[right][0]);
      if (!m || m[1] !== id) continue;
      syms[pos] = [id, syms[pos][1], syms[right][2]];
      alive[right] = 0;
      next[pos] = next[right];
      if (next[pos] >= 0) prev[next[pos]] = pos;
      consider(prev[pos]);
      consider(pos);
    }
    syms = syms.filter((_, i) => alive[i]);
    if (!this.vocabR) this.vocabR = invert(this.vocab);
    return syms.map(([id, s, e]) => [id, this.vocabR[id], s, e]);
  }
}

function invert(vocab) {
  const r = [];
  for (const [tok, id] of vocab) r[id] = tok;
  return r;
}

function makeModel(cfg) {
  if (!cfg) fail('tokenizer.json has no model section');
  const type = cfg.type ?? (cfg.merges ? 'BPE' : cfg.continuing_subword_prefix !== undefined ? 'WordPiece' : undefined);
  switch (type) {
    case 'WordPiece': return new WordPiece(cfg);
    case 'BPE': return new BPE(cfg);
    default: return unsupported('model', type);
  }
}

// ---------------------------------------------------------------- post-processors
// Each takes [encoding, pair encoding or null] and returns one encoding; an encoding is
// {ids, tokens, offsets, typeIds, specialTokensMask}.

const special = (id, token, typeId) => ({ids: [id], tokens: [token], offsets: [[0, 0]], typeIds: [typeId],
  specialTokensMask: [1]});
function concat(parts) {
  const out = {ids: [], tokens: [], offsets: [], typeIds: [], specialTokensMask: []};
  for (const p of parts) for (const k of Object.keys(out)) out[k].push(...p[k]);
  return out;
}
const withType = (e, typeId) => ({...e, typeIds: e.ids.map(() => typeId)});

/** The ByteLevel post-processor's trim_offsets: leave leading and trailing spaces out of the offsets. */
function trimOffsets(e, addPrefixSpace) {
  const spaceLike = (c) => c === BYTE_TO_CHAR[32] || isSpace(c);
  e.offsets = e.offsets.map(([s, t], i) => {
    const chars = Array.from(e.tokens[i]);
    let lead = 0, trail = 0;
    while (lead < chars.length && spaceLike(chars[lead])) lead++;
    while (trail < chars.length && spaceLike(chars[chars.length - 1 - trail])) trail++;
    if (lead > 0) {
      if ((i === 0 || s === 0) && addPrefixSpace && lead === 1) lead = 0;
      s = Math.min(s + lead, t);
    }
    if (trail > 0 && t >= trail) t = Math.max(t - trail, s);
    return [s, t];
  });
  return e;
}

function makePostProcessor(cfg) {
  const plain = ([a, b]) => b ? concat([withType(a, 0), withType(b, 1)]) : withType(a, 0);
  if (!cfg) return (seqs) => plain(seqs);
  switch (cfg.type) {
    case 'BertProcessing': {
      const [cls, sep] = [cfg.cls, cfg.sep];
      return ([a, b], add) => !add ? plain([a, b]) : concat([special(cls[1], cls[0], 0), withType(a, 0),
        special(sep[1], sep[0], 0), ...(b ? [withType(b, 1), special(sep[1], sep[0], 1)] : [])]);
    }
    case 'RobertaProcessing': {
      const [cls, sep] = [cfg.cls, cfg.sep];
      return ([a, b], add) => {
        if (cfg.trim_offsets) { trimOffsets(a, cfg.add_prefix_space); if (b) trimOffsets(b, cfg.add_prefix_space); }
        return !add ? plain([a, b]) : concat([special(cls[1], cls[0], 0), withType(a, 0), special(sep[1], sep[0], 0),
          ...(b ? [special(sep[1], sep[0], 0), withType(b, 0), special(sep[1], sep[0], 0)] : [])]);
      };
    }
    case 'TemplateProcessing':
      return ([a, b], add) => {
        if (!add) return plain([a, b]);
        return concat((b ? cfg.pair : cfg.single).map((piece) => {
          if (piece.Sequence) return withType(piece.Sequence.id === 'A' ? a : b, piece.Sequence.type_id);
          const tok = cfg.special_tokens[piece.SpecialToken.id] ??
            fail(`tokenizer.json: TemplateProcessing names the special token '${piece.SpecialToken.id}' but does not define it`);
          const typeId = piece.SpecialToken.type_id;
          return {ids: tok.ids, tokens: tok.tokens, offsets: tok.ids.map(() => [0, 0]),
            typeIds: tok.ids.map(() => typeId), specialTokensMask: tok.ids.map(() => 1)};
        }));
      };
    case 'ByteLevel':
      return ([a, b]) => {
        if (cfg.trim_offsets) { trimOffsets(a, cfg.add_prefix_space); if (b) trimOffsets(b, cfg.add_prefix_space); }
        return plain([a, b]);
      };
    case 'Sequence': {
      if (cfg.processors.length === 1) return makePostProcessor(cfg.processors[0]);
      if (cfg.processors.length === 2 && cfg.processors[0].type === 'ByteLevel') {
        const [trim, rest] = cfg.processors.map(makePostProcessor);
        return ([a, b], add) => rest([a, b].map((e) => e && trim([e], add)), add);
      }
      return unsupported('post_processor', 'Sequence of ' + cfg.processors.map((p) => p.type).join(', '));
    }
    default: return unsupported('post_processor', cfg.type);
  }
}

// ---------------------------------------------------------------- decoders
function wordPieceCleanup(s) {
  return s.replaceAll(' .', '.').replaceAll(' ?', '?').replaceAll(' !', '!').replaceAll(' ,', ',')
    .replaceAll(" ' ", "'").replaceAll(" n't", "n't").replaceAll(" 'm", "'m").replaceAll(' do not', " don't")
    .replaceAll(" 's", "'s").replaceAll(" 've", "'ve").replaceAll(" 're", "'re");
}

function makeDecoder(cfg) {
  if (!cfg) return (tokens) => tokens.join(' ');
  switch (cfg.type) {
    case 'WordPiece': {
      const prefix = cfg.prefix ?? '##', cleanup = cfg.cleanup ?? true;
      return (tokens) => tokens.map((t, i) => {
        if (i > 0) t = t.startsWith(prefix) ? t.replace(prefix, '') : ' ' + t;
        return cleanup ? wordPieceCleanup(t) : t;
      }).join('');
    }
    case 'ByteLevel':
      return (tokens) => {
        const bytes = [];
        for (const t of tokens) {
          const chars = Array.from(t);
          if (chars.every((c) => CHAR_TO_BYTE.has(c))) chars.forEach((c) => bytes.push(CHAR_TO_BYTE.get(c)));
          else bytes.push(...utf8.encode(t));
        }
        return UTF8_DECODER.decode(new Uint8Array(bytes));
      };
    default: return unsupported('decoder', cfg.type);
  }
}

// ---------------------------------------------------------------- added tokens
class AddedTokens {
  constructor(list, normalize) {
    this.byId = new Map(list.map((t) => [t.id, t]));
    this.byContent = new Map(list.map((t) => [t.content, t.id]));
    // patterns by first code point, longest first (leftmost-longest matching)
    const index = (tokens, content) => {
      const m = new Map();
      for (const t of tokens) {
        const chars = content(t);
        if (!chars.length) continue;
        if (!m.has(chars[0])) m.set(chars[0], []);
        m.get(chars[0]).push({token: t, chars});
      }
      for (const v of m.values()) v.sort((x, y) => y.chars.length - x.chars.length);
      return m;
    };
    this.raw = index(list.filter((t) => !t.normalized), (t) => Array.from(t.content));
    this.normalized = index(list.filter((t) => t.normalized), (t) => normalize(Aligned.of(t.content)).chars);
  }
  isSpecial(id) { return !!this.byId.get(id)?.special; }
  /** Split `t` into pieces; a piece that is an added token gets `.tokenId`. */
  split(t, which) {
    const patterns = which === 'raw' ? this.raw : this.normalized;
    if (patterns.size === 0 || t.length === 0) return [t];
    const c = t.chars, ranges = [], ids = [];
    let done = 0;
    for (let i = 0; i < c.length;) {
      const cands = patterns.get(c[i]);
      const hit = cands && cands.find((p) => p.chars.every((x, k) => c[i + k] === x));
      if (!hit) { i++; continue; }
      let [start, stop] = [i, i + hit.chars.length];
      const tok = hit.token;
      if (tok.single_word && ((start > 0 && IS_WORD.test(c[start - 1])) || (stop < c.length && IS_WORD.test(c[stop])))) {
        i++;
        continue;
      }
      if (tok.lstrip) { let s = start; while (s > done && isSpace(c[s - 1])) s--; start = s; }
      if (tok.rstrip) while (stop < c.length && isSpace(c[stop])) stop++;
      ranges.push([start, stop]); ids.push(tok.id);
      done = i = stop;
    }
    const out = [];
    let last = 0;
    ranges.forEach(([a, b], k) => {
      if (a > last) out.push(t.slice(last, a));
      const p = t.slice(a, b);
      p.tokenId = ids[k];
      out.push(p);
      last = b;
    });
    if (last < c.length) out.push(t.slice(last, c.length));
    return out;
  }
}

// ---------------------------------------------------------------- the tokenizer
export class Tokenizer {
  /** Build from a parsed tokenizer.json (or its text). */
  static fromJSON(json) {
    if (typeof json === 'string') {
      try { json = JSON.parse(json); } catch (e) { fail(`tokenizer.json is not valid JSON: ${e.message}`); }
    }
    if (!json || typeof json !== 'object') fail('tokenizer.json must hold a JSON object');
    return new Tokenizer(json);
  }

  /** Fetch and read the tokenizer.json at `url` (relative to the page). */
  static async fromURL(url, {fetch: get = globalThis.fetch} = {}) {
    let response;
    try { response = await get(url); } catch (e) { fail(`could not fetch ${url}: ${e.message}`); }
    if (!response.ok) fail(`could not fetch ${url}: HTTP ${response.status}`);
    return Tokenizer.fromJSON(await response.text());
  }

  constructor(json) {
    for (const [section, value] of [['truncation', json.truncation], ['padding', json.padding]]) {
      if (value) fail(`tokenizer.json: ${section} is set; this tokenizer does not truncate or pad`,
        `set it to null and ${section === 'padding' ? 'pad' : 'truncate'} the ids yourself`);
    }
    this.normalize = makeNormalizer(json.normalizer);
    this.preTokenize = makePreTokenizer(json.pre_tokenizer);
    this.model = makeModel(json.model);
    this.postProcess = makePostProcessor(json.post_processor);
    this.decodeTokens = makeDecoder(json.decoder);
    this.added = new AddedTokens(json.added_tokens ?? [], this.normalize);
    this.vocab = new Map(this.model.vocab);
    for (const [content, id] of this.added.byContent) this.vocab.set(content, id);
    this.vocabR = invert(this.vocab);
  }

  get vocabSize() { return this.vocab.size; }
  tokenToId(token) { return this.vocab.get(token); }
  idToToken(id) { return this.vocabR[id]; }

  /** Encode one sequence (and optionally a pair). Offsets count code points of each input. */
  encode(text, {pair = null, addSpecialTokens = true} = {}) {
    if (typeof text !== 'string') fail(`encode() needs a string, got ${typeof text}`);
    const seqs = [this.encodeOne(text), pair === null ? null : this.encodeOne(pair)];
    const e = this.postProcess(seqs, addSpecialTokens);
    return {ids: e.ids, tokens: e.tokens, offsets: e.offsets, attentionMask: e.ids.map(() => 1),
      typeIds: e.typeIds, specialTokensMask: e.specialTokensMask};
  }

  encodeOne(text) {
    const e = {ids: [], tokens: [], offsets: [], typeIds: [], specialTokensMask: []};
    const push = (id, token, offsets) => {
      e.ids.push(id); e.tokens.push(token); e.offsets.push(offsets); e.typeIds.push(0); e.specialTokensMask.push(0);
    };
    for (const raw of this.added.split(Aligned.of(text), 'raw')) {
      if (raw.tokenId !== undefined) { push(raw.tokenId, this.vocabR[raw.tokenId], raw.span(0, raw.length)); continue; }
      for (const piece of this.added.split(this.normalize(raw), 'normalized')) {
        if (piece.length === 0) continue;
        if (piece.tokenId !== undefined) {
          push(piece.tokenId, this.vocabR[piece.tokenId], piece.span(0, piece.length));
          continue;
        }
        for (const word of this.preTokenize([piece])) {
          if (word.length === 0) continue;
          for (const [id, token, s, t] of this.model.tokenize(word.chars)) push(id, token, word.span(s, t));
        }
      }
    }
    return e;
  }

  /** The text of `ids`; special tokens are left out unless skipSpecialTokens is false. */
  decode(ids, {skipSpecialTokens = true} = {}) {
    const tokens = [];
    for (const id of ids) {
      const token = this.vocabR[Number(id)];
      if (token === undefined) continue;
      if (skipSpecialTokens && this.added.isSpecial(Number(id))) continue;
      tokens.push(token);
    }
    return this.decodeTokens(tokens);
  }
}

/** Turn code point offsets of `text` into UTF-16 indexes (what String.prototype.slice takes). */
export function toUTF16Offsets(text, offsets) {
  const at = [0];
  for (const c of text) at.push(at[at.length - 1] + c.length);
  return offsets.map(([s, e]) => [at[s], at[e]]);
}
