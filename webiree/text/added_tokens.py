"""The `added_tokens` section: tokens matched in the text before any model sees it.

A token with normalized=false is found in the original text; one with normalized=true in the
normalized text of what is left. A match, leftmost then longest, becomes one token with the
added token's id. lstrip, rstrip and single_word are not supported (refused).
"""

from __future__ import annotations

from ..errors import ModelError
from .normalized import Piece


class AddedVocabulary:
    def __init__(self, entries: list, normalizer):
        self.by_id, self.special, raw, norm = {}, set(), {}, {}
        for e in entries:
            for flag in ("lstrip", "rstrip", "single_word"):
                if e.get(flag):
                    raise ModelError(f"tokenizer.json: added_tokens {e.get('content')!r} has {flag}=true, "
                                     "which is not supported")
            content, tid = e["content"], e["id"]
            self.by_id[tid] = content
            if e.get("special"):
                self.special.add(tid)
            if not content:
                continue
            if e.get("normalized", not e.get("special")) and normalizer is not None:
                key = normalizer(Piece.of(content)).text
                if key:
                    norm[key] = tid
            else:
                raw[content] = tid
        self.raw, self.norm = raw, norm

    @staticmethod
    def _split(p: Piece, table: dict) -> list:
        if not table:
            return [p]
        text, out, start, i = p.text, [], 0, 0
        firsts = {t[0] for t in table}
        while i < len(text):
            best = None
            if text[i] in firsts:
                for t in table:
                    if (best is None or len(t) > len(best)) and text.startswith(t, i):
                        best = t
            if best is None:
                i += 1
                continue
            if start < i:
                out.append(p.slice(start, i))
            m = p.slice(i, i + len(best))
            m.token_id = table[best]
            out.append(m)
            i = start = i + len(best)
        if start < len(text):
            out.append(p.slice(start, len(text)))
        return out

    def split(self, text: str, normalizer) -> list:
        """The original text -> pieces: added tokens (token_id set) and normalized text between them."""
        out = []
        for p in self._split(Piece.of(text), self.raw):
            if p.token_id is not None:
                out.append(p)
                continue
            if normalizer is not None:
                p = normalizer(p)
            out.extend(self._split(p, self.norm))
        return out
