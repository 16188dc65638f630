"""The `post_processor` section: special tokens around the sequence(s), type ids, and the
byte-level offset trimming.

Supported: TemplateProcessing, BertProcessing, RobertaProcessing, ByteLevel, Sequence, null.
Every processor works on an encoding's parallel lists: ids, tokens, offsets, type_ids and
special_tokens_mask.
"""

from __future__ import annotations

from ..errors import ModelError
from .normalized import WHITESPACE
from .pre_tokenizers import BYTE_CHAR

_SPACE = BYTE_CHAR[ord(" ")]


def _columns(ids, tokens, offsets, type_id, special):
    n = len(ids)
    return {"ids": list(ids), "tokens": list(tokens), "offsets": list(offsets),
            "type_ids": [type_id] * n, "special_tokens_mask": [int(special)] * n}


def _join(parts: list) -> dict:
    out = {k: [] for k in ("ids", "tokens", "offsets", "type_ids", "special_tokens_mask")}
    for p in parts:
        for k in out:
            out[k].extend(p[k])
    return out


def _retype(seq: dict, type_id: int) -> dict:
    return {**seq, "type_ids": [type_id] * len(seq["ids"])}


def trim_offsets(seq: dict, add_prefix_space: bool) -> dict:
    """ByteLevel's trim_offsets: a token's offsets leave out its leading and trailing spaces
    (but keep the one space add_prefix_space put before the first word)."""
    offsets = []
    for i, (tok, (a, b)) in enumerate(zip(seq["tokens"], seq["offsets"])):
        lead = len(tok) - len(tok.lstrip(_SPACE + "".join(WHITESPACE)))
        trail = len(tok) - len(tok.rstrip(_SPACE + "".join(WHITESPACE)))
        if lead:
            if (i == 0 or a == 0) and add_prefix_space and lead == 1:
                lead = 0
            a = min(a + lead, b)
        if trail and b >= trail:
            b = max(b - trail, a)
        offsets.append((a, b))
    return {**seq, "offsets": offsets}


class Template:
    """TemplateProcessing, and BertProcessing / RobertaProcessing as the templates they are."""

    def __init__(self, single: list, pair: list, specials: dict):
        self.single, self.pair, self.specials = single, pair, specials

    @classmethod
    def from_spec(cls, spec: dict) -> "Template":
        specials = {name: (s["ids"], s["tokens"]) for name, s in spec.get("special_tokens", {}).items()}

        def pieces(items):
            out = []
            for item in items:
                if "SpecialToken" in item:
                    t = item["SpecialToken"]
                    if t["id"] not in specials:
                        raise ModelError(f"tokenizer.json: post_processor TemplateProcessing names {t['id']!r} "
                                         "but special_tokens does not define it")
                    out.append(("special", t["id"], t.get("type_id", 0)))
                else:
                    t = item["Sequence"]
                    out.append(("sequence", t["id"], t.get("type_id", 0)))
            return out
        return cls(pieces(spec.get("single", [])), pieces(spec.get("pair", [])), specials)

    @classmethod
    def bert(cls, spec: dict, roberta: bool = False) -> "Template":
        (sep, sep_id), (cls_, cls_id) = spec["sep"], spec["cls"]
        specials = {sep: ([sep_id], [sep]), cls_: ([cls_id], [cls_])}
        single = [("special", cls_, 0), ("sequence", "A", 0), ("special", sep, 0)]
        second = 0 if roberta else 1
        pair = single + ([("special", sep, 0)] if roberta else []) + [("sequence", "B", second),
                                                                       ("special", sep, second)]
        return cls(single, pair, specials)

    def __call__(self, a: dict, b: dict | None) -> dict:
        parts = []
        for kind, name, type_id in (self.single if b is None else self.pair):
            if kind == "special":
                ids, toks = self.specials[name]
                parts.append(_columns(ids, toks, [(0, 0)] * len(ids), type_id, True))
            else:
                parts.append(_retype(a if name == "A" else b, type_id))
        return _join(parts)


def _trimmed(proc, a, b):
    """The two sequences with their offsets trimmed of the spaces byte-level BPE keeps in tokens,
    where the processor's trim_offsets says so."""
    if not proc.trim:
        return a, b
    return trim_offsets(a, proc.add_prefix_space), None if b is None else trim_offsets(b, proc.add_prefix_space)


class Roberta(Template):
    def __init__(self, spec: dict):
        t = Template.bert(spec, roberta=True)
        super().__init__(t.single, t.pair, t.specials)
        self.trim = spec.get("trim_offsets", True)
        self.add_prefix_space = spec.get("add_prefix_space", True)

    def __call__(self, a, b):
        return super().__call__(*_trimmed(self, a, b))


class ByteLevel:
    def __init__(self, spec: dict):
        self.trim = spec.get("trim_offsets", True)
        self.add_prefix_space = spec.get("add_prefix_space", True)

    def __call__(self, a, b):
        a, b = _trimmed(self, a, b)
        return a if b is None else _join([a, _retype(b, 1)])


def plain(a, b):
    return a if b is None else _join([a, _retype(b, 1)])


def build(spec: dict | None):
    if spec is None:
        return plain
    kind = spec.get("type")
    if kind == "TemplateProcessing":
        return Template.from_spec(spec)
    if kind == "BertProcessing":
        return Template.bert(spec)
    if kind == "RobertaProcessing":
        return Roberta(spec)
    if kind == "ByteLevel":
        return ByteLevel(spec)
    raise ModelError(f"tokenizer.json: post_processor {kind!r} is not supported",
                     hint="supported post-processors: TemplateProcessing, BertProcessing, RobertaProcessing, "
                          "ByteLevel")
