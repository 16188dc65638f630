"""The `model` section: one word -> tokens, each (id, token string, start, end) with start/end
in the word's characters.

Supported: WordPiece, and BPE without dropout, subword prefixes/suffixes or byte fallback
(GPT-2's byte-level BPE).
"""

from __future__ import annotations

from ..errors import ModelError


def _refuse(what: str, hint: str):
    raise ModelError(f"tokenizer.json: model {what} is not supported", hint=hint)


class WordPiece:
    def __init__(self, spec: dict):
        self.vocab = dict(spec["vocab"])
        self.unk = spec.get("unk_token", "[UNK]")
        self.prefix = spec.get("continuing_subword_prefix", "##")
        self.max_chars = spec.get("max_input_chars_per_word", 100)
        if self.unk not in self.vocab:
            raise ModelError(f"tokenizer.json: WordPiece unk_token {self.unk!r} is not in the vocabulary")
        self.inverse = {i: t for t, i in self.vocab.items()}

    def tokenize(self, word: str) -> list:
        if len(word) > self.max_chars:
            return [(self.vocab[self.unk], self.unk, 0, len(word))]
        out, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start:
                sub = word[start:end] if start == 0 else self.prefix + word[start:end]
                if sub in self.vocab:
                    out.append((self.vocab[sub], sub, start, end))
                    break
                end -= 1
            if end == start:   # no prefix of the rest is in the vocabulary: the whole word is unknown
                return [(self.vocab[self.unk], self.unk, 0, len(word))]
            start = end
        return out


class BPE:
    def __init__(self, spec: dict):
        if spec.get("dropout") not in (None, 0, 0.0):
            _refuse("BPE with dropout", "dropout samples tokens at random; set it to null for inference")
        for key in ("continuing_subword_prefix", "end_of_word_suffix"):
            if spec.get(key):
                _refuse(f"BPE {key}={spec[key]!r}", "byte-level BPE (GPT-2) is supported")
        for key in ("byte_fallback", "fuse_unk"):
            if spec.get(key):
                _refuse(f"BPE {key}=true", "byte-level BPE (GPT-2) is supported")
        self.vocab = dict(spec["vocab"])
        self.inverse = {i: t for t, i in self.vocab.items()}
        self.unk = spec.get("unk_token")
        self.ignore_merges = bool(spec.get("ignore_merges"))
        self.ranks = {}
        for rank, m in enumerate(spec.get("merges", [])):
            a, b = m.split(" ", 1) if isinstance(m, str) else m
            self.ranks[(a, b)] = rank

    def _id(self, token: str, word: str):
        if token in self.vocab:
            return self.vocab[token]
        if self.unk is not None and self.unk in self.vocab:
            return self.vocab[self.unk]
        return None     # the library drops a symbol it has no id for when there is no unk token

    def tokenize(self, word: str) -> list:
        if self.ignore_merges and word in self.vocab:
            return [(self.vocab[word], word, 0, len(word))]
        syms = list(word)
        starts = list(range(len(word)))
        ranks = self.ranks
        while len(syms) > 1:
            best, at = None, -1
            for i in range(len(syms) - 1):
                r = ranks.get((syms[i], syms[i + 1]))
                if r is not None and (best is None or r < best):
                    best, at = r, i
            if best is None:
                break
            syms[at:at + 2] = [syms[at] + syms[at + 1]]
            del starts[at + 1]
        out = []
        for s, a, b in zip(syms, starts, starts[1:] + [len(word)]):
            tid = self._id(s, word)
            if tid is not None:
                out.append((tid, s if s in self.vocab else self.unk, a, b))
        return out


def build(spec: dict):
    kind = (spec or {}).get("type")
    if kind is None and spec and "merges" in spec:
        kind = "BPE"
    if kind == "WordPiece":
        return WordPiece(spec)
    if kind == "BPE":
        return BPE(spec)
    raise ModelError(f"tokenizer.json: model {kind!r} is not supported", hint="supported models: WordPiece, BPE")
