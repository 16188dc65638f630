"""The `normalizer` section of a tokenizer.json: text -> normalized text, span by span.

Supported: BertNormalizer, Lowercase, NFD, StripAccents, Sequence of those, and null.
"""

from __future__ import annotations

import unicodedata

from ..errors import ModelError
from .normalized import WHITESPACE, Piece
from .unicode_tables import CONTROL, NONSPACING_MARK, in_ranges

# CJK ideographs BertNormalizer surrounds with spaces (tokenizers' is_chinese_char).
_CJK = ((0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
        (0x2B740, 0x2B81F), (0x2B920, 0x2CEAF), (0x2F800, 0x2FA1F))


def _is_cjk(c: str) -> bool:
    cp = ord(c)
    return any(a <= cp <= b for a, b in _CJK)


def _clean(c: str) -> str:
    if c in "\t\n\r":
        return " "
    cp = ord(c)
    if cp == 0 or cp == 0xFFFD or in_ranges(CONTROL, cp):
        return ""
    return " " if c in WHITESPACE else c


def _strip_accents(c: str) -> str:
    return "".join(d for d in unicodedata.normalize("NFD", c) if not in_ranges(NONSPACING_MARK, ord(d)))


def _nfd(c: str) -> str:
    return unicodedata.normalize("NFD", c)


def _lower(c: str) -> str:
    return c.lower()


class BertNormalizer:
    def __init__(self, spec: dict):
        self.clean_text = spec.get("clean_text", True)
        self.chinese = spec.get("handle_chinese_chars", True)
        self.lowercase = spec.get("lowercase", True)
        strip = spec.get("strip_accents")
        self.strip_accents = self.lowercase if strip is None else strip

    def __call__(self, p: Piece) -> Piece:
        if self.clean_text:
            p = p.map_chars(_clean)
        if self.chinese:
            p = p.map_chars(lambda c: f" {c} " if _is_cjk(c) else c)
        if self.strip_accents:
            p = p.map_chars(_strip_accents)
        if self.lowercase:
            p = p.map_chars(_lower)
        return p


class _PerChar:
    def __init__(self, fn):
        self.fn = fn

    def __call__(self, p: Piece) -> Piece:
        return p.map_chars(self.fn)


class Sequence:
    def __init__(self, steps: list):
        self.steps = steps

    def __call__(self, p: Piece) -> Piece:
        for step in self.steps:
            p = step(p)
        return p


def _strip_marks(c: str) -> str:
    return "" if in_ranges(NONSPACING_MARK, ord(c)) else c


def build(spec: dict | None):
    """The normalizer a tokenizer.json describes (None when it has none)."""
    if spec is None:
        return None
    kind = spec.get("type")
    if kind == "BertNormalizer":
        return BertNormalizer(spec)
    if kind == "Lowercase":
        return _PerChar(_lower)
    if kind == "NFD":
        return _PerChar(_nfd)
    if kind == "StripAccents":
        return _PerChar(_strip_marks)
    if kind == "Sequence":
        return Sequence([build(s) for s in spec.get("normalizers", [])])
    raise ModelError(f"tokenizer.json: normalizer {kind!r} is not supported",
                     hint="supported normalizers: BertNormalizer, Lowercase, NFD, StripAccents, Sequence")
