// Type declarations of tokenizer.js: Hugging Face tokenizer.json files in the browser.
//
// Supported sections (anything else throws a WebireeError of kind 'tokenizer' naming the
// section and its type):
//   normalizer      BertNormalizer, Lowercase, StripAccents, NFD, NFKD, Sequence
//   pre_tokenizer   BertPreTokenizer, ByteLevel (add_prefix_space, use_regex), WhitespaceSplit, Sequence
//   model           WordPiece, BPE (no dropout)
//   post_processor  BertProcessing, RobertaProcessing, TemplateProcessing, ByteLevel (trim_offsets),
//                   Sequence of ByteLevel and one of those
//   decoder         WordPiece, ByteLevel (none: tokens joined by spaces)
//   added_tokens    special and not, normalized and not, single_word, lstrip, rstrip
//   truncation, padding  must be null

export interface Encoding {
  ids: number[];
  tokens: string[];
  /** [start, end) of each token in its input, in Unicode code points (as the `tokenizers`
   * library reports offsets to Python), not UTF-16 code units: use toUTF16Offsets to slice a
   * JavaScript string. Special tokens added by the post-processor have [0, 0]. */
  offsets: [number, number][];
  /** all 1: nothing is padded */
  attentionMask: number[];
  /** 0 for the first sequence, 1 for the pair (as the post-processor assigns them) */
  typeIds: number[];
  /** 1 where the post-processor added a special token */
  specialTokensMask: number[];
}

export interface EncodeOptions {
  /** a second sequence (sentence pairs) */
  pair?: string | null;
  /** add the post-processor's special tokens ([CLS] ... [SEP]); default true */
  addSpecialTokens?: boolean;
}

export interface DecodeOptions {
  /** leave special added tokens out; default true */
  skipSpecialTokens?: boolean;
}

export class Tokenizer {
  /** Build from a parsed tokenizer.json object or its text. */
  static fromJSON(json: object | string): Tokenizer;
  /** Fetch the tokenizer.json at `url` (relative to the page) and build from it. */
  static fromURL(url: string, options?: {fetch?: typeof fetch}): Promise<Tokenizer>;
  readonly vocabSize: number;
  encode(text: string, options?: EncodeOptions): Encoding;
  decode(ids: readonly (number | bigint)[], options?: DecodeOptions): string;
  tokenToId(token: string): number | undefined;
  idToToken(id: number): string | undefined;
}

/** Code point offsets of `text` (as in Encoding.offsets) to UTF-16 indexes, for text.slice(start, end). */
export function toUTF16Offsets(text: string, offsets: readonly [number, number][]): [number, number][];

export {WebireeError} from './webiree.js';
