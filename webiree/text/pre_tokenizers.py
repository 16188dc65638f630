"""The `pre_tokenizer` section: a normalized piece -> the words a model tokenizes one by one.

Supported: BertPreTokenizer, ByteLevel (GPT-2's split pattern and byte-to-unicode
mapping), WhitespaceSplit, Sequence of those, and null.

GPT-2's pattern classes characters with unicodedata.category: a character assigned after
this Python's Unicode version (Python 3.11 has Unicode 14; the library's regex engine is
newer) is treated as unassigned, where the library may see a letter or a number.
"""

from __future__ import annotations

import unicodedata

from ..errors import ModelError
from .normalized import WHITESPACE, Piece
from .unicode_tables import PUNCTUATION, in_ranges


def _bert_punct(c: str) -> bool:
    return in_ranges(PUNCTUATION, ord(c))


def _is_space(c: str) -> bool:
    return c in WHITESPACE


class BertPreTokenizer:
    """Split on whitespace (dropped), then isolate each punctuation character."""

    def __call__(self, p: Piece) -> list:
        return [q for w in p.split(_is_space, "removed") for q in w.split(_bert_punct, "isolated")]


class WhitespaceSplit:
    def __call__(self, p: Piece) -> list:
        return p.split(_is_space, "removed")


def bytes_to_unicode() -> dict:
    """GPT-2's byte -> printable character table: printable Latin-1 bytes map to themselves,
    the other 68 bytes to U+0100 and up, in byte order."""
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, n = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    return table


BYTE_CHAR = bytes_to_unicode()
CHAR_BYTE = {c: b for b, c in BYTE_CHAR.items()}


def _kind(c: str) -> str:
    """GPT-2 pattern's classes: L (\\p{L}), N (\\p{N}), S (\\s), O (anything else)."""
    if c in WHITESPACE:
        return "S"
    cat = unicodedata.category(c)
    return cat[0] if cat[0] in "LN" else "O"


_CONTRACTIONS = ("s", "t", "re", "ve", "m", "ll", "d")


def gpt2_split(text: str) -> list:
    """The spans GPT-2's pattern matches, in order (every character is in one):
    's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"""
    kinds = [_kind(c) for c in text]
    n, i, out = len(text), 0, []
    while i < n:
        j = None
        if text[i] == "'":
            for c in _CONTRACTIONS:
                if text.startswith(c, i + 1):
                    j = i + 1 + len(c)
                    break
        if j is None:
            k = i + 1 if text[i] == " " and i + 1 < n and kinds[i + 1] != "S" else i
            if kinds[k] != "S":       # ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`
                j = k + 1
                while j < n and kinds[j] == kinds[k]:
                    j += 1
            else:                     # `\s+(?!\S)` leaves the last space to the next word, else `\s+`
                j = i + 1
                while j < n and kinds[j] == "S":
                    j += 1
                if j < n and j - i > 1:
                    j -= 1
        out.append((i, j))
        i = j
    return out


class ByteLevel:
    def __init__(self, spec: dict):
        self.add_prefix_space = spec.get("add_prefix_space", True)
        self.use_regex = spec.get("use_regex", True)

    def __call__(self, p: Piece) -> list:
        if self.add_prefix_space and p.text and not p.text.startswith(" "):
            p = Piece(" " + p.text, p.spans[:1] + p.spans, p.token_id)
        words = [p.slice(a, b) for a, b in gpt2_split(p.text)] if self.use_regex else [p]
        return [w.map_chars(lambda c: "".join(BYTE_CHAR[b] for b in c.encode("utf-8"))) for w in words]


class Sequence:
    def __init__(self, steps: list):
        self.steps = steps

    def __call__(self, p: Piece) -> list:
        words = [p]
        for step in self.steps:
            words = [q for w in words for q in step(w)]
        return words


def build(spec: dict | None):
    if spec is None:
        return None
    kind = spec.get("type")
    if kind == "BertPreTokenizer":
        return BertPreTokenizer()
    if kind == "ByteLevel":
        return ByteLevel(spec)
    if kind == "WhitespaceSplit":
        return WhitespaceSplit()
    if kind == "Sequence":
        return Sequence([build(s) for s in spec.get("pretokenizers", [])])
    raise ModelError(f"tokenizer.json: pre_tokenizer {kind!r} is not supported",
                     hint="supported pre-tokenizers: BertPreTokenizer, ByteLevel, WhitespaceSplit, Sequence")
