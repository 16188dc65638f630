"""A piece of text as the pipeline sees it: its current characters, and for each one the
span of the original string it came from.

Every normalizer and pre-tokenizer rewrites pieces through `Piece`, so that each token's
offsets point into the string the user gave (in characters, as the tokenizers library's
Python binding reports them). A character a step inserts (the second character of a
decomposition, a byte of a multi-byte character) shares the span of the character it
came from; a character a step removes takes its span with it.
"""

from __future__ import annotations

from dataclasses import dataclass

# Rust's char::is_whitespace (the Unicode White_Space property). Python's str.isspace also
# counts U+001C..U+001F, which the tokenizers library does not.
WHITESPACE = frozenset("\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
                       "\u2009\u200a\u2028\u2029\u202f\u205f\u3000")


@dataclass
class Piece:
    text: str
    spans: list          # [(start, end)] in the original string, one per character of text
    token_id: int | None = None     # set when the piece is an added token, which no model splits

    @classmethod
    def of(cls, original: str, start: int = 0, end: int | None = None) -> "Piece":
        end = len(original) if end is None else end
        return cls(original[start:end], [(i, i + 1) for i in range(start, end)])

    def map_chars(self, fn) -> "Piece":
        """fn(char) -> the string that replaces it (empty removes it); every new character
        takes the span of the character it replaces."""
        out, spans = [], []
        for c, span in zip(self.text, self.spans):
            r = fn(c)
            out.append(r)
            spans.extend([span] * len(r))
        return Piece("".join(out), spans, self.token_id)

    def slice(self, start: int, end: int) -> "Piece":
        return Piece(self.text[start:end], self.spans[start:end], self.token_id)

    def offsets(self, start: int, end: int) -> tuple:
        """The original span of characters [start, end) of this piece."""
        if start >= end:
            return (0, 0)
        return (self.spans[start][0], self.spans[end - 1][1])

    def split(self, rule, mode: str) -> list:
        """Split where rule(char) holds: mode 'removed' drops those characters, 'isolated' keeps
        each as a piece of its own. Empty pieces are dropped."""
        out, start = [], 0
        for i, c in enumerate(self.text):
            if rule(c):
                if start < i:
                    out.append(self.slice(start, i))
                if mode == "isolated":
                    out.append(self.slice(i, i + 1))
                start = i + 1
        if start < len(self.text):
            out.append(self.slice(start, len(self.text)))
        return out
