"""The `decoder` section: tokens -> text.

Supported: WordPiece, ByteLevel, null (tokens joined by spaces).
"""

from __future__ import annotations

from ..errors import ModelError
from .pre_tokenizers import CHAR_BYTE

_CLEANUP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"),
            (" do not", " don't"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


def cleanup(text: str) -> str:
    """The library's clean_up_tokenization: no space before punctuation and English contractions."""
    for a, b in _CLEANUP:
        text = text.replace(a, b)
    return text


class WordPiece:
    def __init__(self, spec: dict):
        self.prefix = spec.get("prefix", "##")
        self.cleanup = spec.get("cleanup", True)

    def __call__(self, tokens: list) -> str:
        out = []
        for i, t in enumerate(tokens):
            if i:
                t = t.replace(self.prefix, "", 1) if t.startswith(self.prefix) else " " + t
            out.append(cleanup(t) if self.cleanup else t)
        return "".join(out)


def byte_level(tokens: list) -> str:
    """Each token's characters back to the bytes they stand for (a token with a character outside
    the byte table, such as an added token, is its own UTF-8), decoded with U+FFFD for bad bytes."""
    raw = bytearray()
    for t in tokens:
        try:
            raw.extend(CHAR_BYTE[c] for c in t)
        except KeyError:
            raw.extend(t.encode("utf-8"))
    return raw.decode("utf-8", errors="replace")


def build(spec: dict | None):
    if spec is None:
        return " ".join
    kind = spec.get("type")
    if kind == "WordPiece":
        return WordPiece(spec)
    if kind == "ByteLevel":
        return byte_level
    raise ModelError(f"tokenizer.json: decoder {kind!r} is not supported",
                     hint="supported decoders: WordPiece, ByteLevel")
