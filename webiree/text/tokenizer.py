"""`Tokenizer`: a Hugging Face tokenizer.json, run in pure Python.

    tok = Tokenizer.from_file("tokenizer.json")
    enc = tok.encode("Hello, world!")      # Encoding: ids, tokens, offsets, attention_mask, type_ids
    tok.decode(enc.ids)                     # special tokens skipped

The pipeline is the library's: added tokens are split out of the text, the rest is
normalized, pre-tokenized into words, each word tokenized by the model, and the
post-processor adds special tokens. Offsets are character offsets into the text given
(as the library's Python binding reports them); special tokens have (0, 0). Anything in the
file this module does not implement raises ModelError naming the section and type.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..errors import ModelError
from .decoders import build as build_decoder
from .models import build as build_model
from .normalizers import build as build_normalizer
from .pre_tokenizers import build as build_pre_tokenizer
from .processors import build as build_post_processor, plain
from .added_tokens import AddedVocabulary


@dataclass
class Encoding:
    ids: list
    tokens: list
    offsets: list
    attention_mask: list
    type_ids: list
    special_tokens_mask: list = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ids)


class Tokenizer:
    def __init__(self, spec: dict):
        if not isinstance(spec, dict) or "model" not in spec:
            raise ModelError("tokenizer.json has no model section", hint="give a Hugging Face tokenizer.json")
        for section in ("truncation", "padding"):
            if spec.get(section) is not None:
                raise ModelError(f"tokenizer.json: {section} is not supported",
                                 hint=f"set {section} to null; pad or truncate the ids yourself")
        self.normalizer = build_normalizer(spec.get("normalizer"))
        self.pre_tokenizer = build_pre_tokenizer(spec.get("pre_tokenizer"))
        self.model = build_model(spec["model"])
        self.post_processor = build_post_processor(spec.get("post_processor"))
        self.decoder = build_decoder(spec.get("decoder"))
        self.added = AddedVocabulary(spec.get("added_tokens") or [], self.normalizer)

    @classmethod
    def from_str(cls, text: str) -> "Tokenizer":
        try:
            spec = json.loads(text)
        except ValueError as e:
            raise ModelError(f"tokenizer.json is not JSON: {e}") from None
        return cls(spec)

    @classmethod
    def from_file(cls, path) -> "Tokenizer":
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise ModelError(f"cannot read {path}: {e.strerror or e}") from None
        return cls.from_str(text)

    def _sequence(self, text: str, type_id: int) -> dict:
        ids, tokens, offsets = [], [], []
        for piece in self.added.split(text, self.normalizer):
            if piece.token_id is not None:
                ids.append(piece.token_id)
                tokens.append(self.added.by_id[piece.token_id])
                offsets.append(piece.offsets(0, len(piece.text)))
                continue
            words = self.pre_tokenizer(piece) if self.pre_tokenizer is not None else [piece]
            for w in words:
                if not w.text:
                    continue
                for tid, tok, a, b in self.model.tokenize(w.text):
                    ids.append(tid)
                    tokens.append(tok)
                    offsets.append(w.offsets(a, b))
        n = len(ids)
        return {"ids": ids, "tokens": tokens, "offsets": offsets, "type_ids": [type_id] * n,
                "special_tokens_mask": [0] * n}

    def encode(self, text: str, pair: str | None = None, add_special_tokens: bool = True) -> Encoding:
        if not isinstance(text, str) or (pair is not None and not isinstance(pair, str)):
            raise TypeError("encode takes str")
        a = self._sequence(text, 0)
        b = None if pair is None else self._sequence(pair, 1)
        seq = self.post_processor(a, b) if add_special_tokens else plain(a, b)
        return Encoding(seq["ids"], seq["tokens"], seq["offsets"], [1] * len(seq["ids"]), seq["type_ids"],
                        seq["special_tokens_mask"])

    def id_to_token(self, tid: int) -> str | None:
        return self.added.by_id.get(tid, self.model.inverse.get(tid))

    def token_to_id(self, token: str) -> int | None:
        for tid, t in self.added.by_id.items():
            if t == token:
                return tid
        return self.model.vocab.get(token)

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        tokens = []
        for tid in ids:
            if skip_special_tokens and tid in self.added.special:
                continue
            t = self.id_to_token(tid)
            if t is not None:
                tokens.append(t)
        return self.decoder(tokens)
