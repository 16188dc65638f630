"""webiree.text against the Hugging Face `tokenizers` library (the reference, used only here):
tokenizers trained in the test on a seeded multilingual corpus, then the same ids, tokens and
offsets for every one of >1,000 seeded strings, and the same decoded text."""

from __future__ import annotations

import json
import random
import time
import unicodedata

import pytest

import tokenizers  # noqa: E402  (the reference; set-up installs it)

from webiree.errors import ModelError   # noqa: E402
from webiree.text import Tokenizer       # noqa: E402
from webiree.text.unicode_tables import CONTROL, NONSPACING_MARK, PUNCTUATION, in_ranges  # noqa: E402

ASCII_WORDS = ("the quick brown fox jumps over lazy dog hello world token model compile shader buffer "
               "running runner unbelievable don't it's we're they've I'm you'll she'd").split()
ACCENTED = ["café", "naïve", "résumé", "Ångström", "über", "façade", "São", "Straße", "İstanbul", "ÉCOLE",
            "crème", "jalapeño", "Ωμέγα", "Σίσυφος"]
OTHER = ["привет", "мир", "Москва", "مرحبا", "שלום", "नमस्ते", "สวัสดี", "안녕하세요", "한국어", "ქართული"]
CJK = ["東京", "日本語", "中文", "汉字", "漢字", "北京大学", "ひらがな", "カタカナ", "𠀀𠀁", "豈"]
EMOJI = ["😀", "👍", "👍🏽", "👩‍💻", "👨‍👩‍👧‍👦", "🏳️‍🌈", "❤️", "🇯🇵", "🤖", "✨", "🧑🏿‍🚀"]
PUNCT = list(".,;:!?-()[]{}\"'/\\@#$%^&*+=<>|~`_") + ["...", "—", "–", "«", "»", "¿", "¡", "、", "。", "「", "」",
                                                    "…", "§", "€", "£", "¥"]
SPACES = [" ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u3000", " \t ", "\u2009", "\u200b", "\u2028", "   \n  "]
CONTROLS = ["\x00", "\x01", "\x07", "\x1b", "\x7f", "\x85", "\u200d", "\ufeff", "\ufffd", "\x0b", "\x0c", "\x1f"]
SPECIALS = ["[CLS]", "[SEP]", "[MASK]", "<|endoftext|>"]


def decomposed(w: str) -> str:
    return unicodedata.normalize("NFD", w)


def corpus(rng: random.Random, n: int) -> list:
    pools = [ASCII_WORDS] * 6 + [ACCENTED, [decomposed(w) for w in ACCENTED], OTHER, CJK, EMOJI, PUNCT]
    lines = []
    for _ in range(n):
        words = [rng.choice(rng.choice(pools)) for _ in range(rng.randint(3, 14))]
        if rng.random() < 0.3:
            words.append(str(rng.randint(0, 10 ** rng.randint(1, 8))))
        lines.append(" ".join(words))
    return lines


def make_strings(rng: random.Random, n: int) -> list:
    pieces = [ASCII_WORDS, ACCENTED, [decomposed(w) for w in ACCENTED], OTHER, CJK, EMOJI, PUNCT, SPACES,
              CONTROLS, SPECIALS]
    out = ["", " ", "a", "\n", "[CLS]", "hello world", "x" * 150, "supercalifragilistic" * 8, "1234567890" * 5,
           "don't stop", "e\u0301", "\u00e9", "  leading", "trailing  ", "a  \t b"]
    while len(out) < n:
        parts = []
        for _ in range(rng.randint(1, 12)):
            r = rng.random()
            if r < 0.05:    # a long word, more characters than WordPiece's max_input_chars_per_word
                parts.append("".join(rng.choice("abcdefghijklmnopqrstuvwxyzé") for _ in range(rng.randint(25, 140))))
            elif r < 0.12:
                parts.append(str(rng.randint(0, 10 ** rng.randint(1, 12))) + rng.choice(["", ".5", ",000", "%"]))
            else:
                parts.append(rng.choice(rng.choice(pieces)))
            parts.append(rng.choice(SPACES[:3] if rng.random() < 0.8 else SPACES + [""]))
        text = "".join(parts)
        if rng.random() < 0.2:
            text = text.upper() if rng.random() < 0.5 else text.title()
        out.append(text)
    return out


@pytest.fixture(scope="module")
def data():
    rng = random.Random(1234)
    return {"corpus": corpus(rng, 3000), "strings": make_strings(rng, 1200)}


def wordpiece_tokenizer(lines, lowercase: bool, processor: str):
    from tokenizers import Tokenizer as HF, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = HF(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=20))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None,
                                                lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator(lines, trainers.WordPieceTrainer(vocab_size=1500, special_tokens=specials))
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    if processor == "template":
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
    else:
        tok.post_processor = processors.BertProcessing(("[SEP]", sep_id), ("[CLS]", cls_id))
    return tok


def byte_level_tokenizer(lines, add_prefix_space: bool, trim_offsets: bool):
    from tokenizers.implementations import ByteLevelBPETokenizer

    tok = ByteLevelBPETokenizer(add_prefix_space=add_prefix_space, trim_offsets=trim_offsets)
    tok.train_from_iterator(lines, vocab_size=1200, min_frequency=2, special_tokens=["<|endoftext|>"])
    return tok


CASES = {
    "wordpiece-uncased-template": lambda lines: wordpiece_tokenizer(lines, True, "template"),
    "wordpiece-cased-bertprocessing": lambda lines: wordpiece_tokenizer(lines, False, "bert"),
    "bytelevel-bpe": lambda lines: byte_level_tokenizer(lines, False, False),
    "bytelevel-bpe-prefix-space-trimmed": lambda lines: byte_level_tokenizer(lines, True, True),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_same_encoding_as_the_library(case, data, tmp_path):
    ref = CASES[case](data["corpus"])
    path = tmp_path / "tokenizer.json"
    ref.save(str(path))
    ours = Tokenizer.from_file(path)
    strings = data["strings"]
    t0 = time.perf_counter()
    mine = [ours.encode(s) for s in strings]
    ours_s = time.perf_counter() - t0
    theirs = [ref.encode(s) for s in strings]
    bad = [(s, m, t) for s, m, t in zip(strings, mine, theirs)
           if (m.ids, m.offsets, m.tokens, m.type_ids) != (t.ids, t.offsets, t.tokens, t.type_ids)]
    for s, m, t in bad[:3]:
        print(f"\n{s!r}\n ours   {list(zip(m.tokens, m.offsets))}\n theirs {list(zip(t.tokens, t.offsets))}")
    assert not bad, f"{len(bad)} of {len(strings)} strings differ"
    assert all(m.attention_mask == t.attention_mask for m, t in zip(mine, theirs))
    pair = [(ours.encode(a, b), ref.encode(a, b)) for a, b in zip(strings[:200], strings[200:400])]
    assert all((m.ids, m.offsets, m.type_ids) == (t.ids, t.offsets, t.type_ids) for m, t in pair)
    decoded = [ours.decode(m.ids) for m in mine]
    assert decoded == [ref.decode(t.ids) for t in theirs]
    kept = [ours.decode(m.ids, skip_special_tokens=False) for m in mine]
    assert kept == [ref.decode(t.ids, skip_special_tokens=False) for t in theirs]
    if case.startswith("bytelevel-bpe") and "prefix" not in case:
        assert kept == strings     # byte-level BPE without a prefix space gives the text back
    ntok = sum(len(m.ids) for m in mine)
    print(f"\n{case}: {len(strings)} strings ({ntok} tokens) and {len(pair)} pairs: ids, tokens and offsets "
          f"identical; {len(decoded) + len(kept)} decodes identical; ours {ours_s * 1e3:.0f} ms")


def test_character_tables_match_the_library():
    """The three tables of webiree.text.unicode_tables, against the library, every 7th code point and
    every code point the tables name."""
    from tokenizers import normalizers, pre_tokenizers

    clean = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=False, strip_accents=False,
                                       lowercase=False)
    strip = normalizers.BertNormalizer(clean_text=False, handle_chinese_chars=False, strip_accents=True,
                                       lowercase=False)
    bert = pre_tokenizers.BertPreTokenizer()
    cps = set(range(0, 0x110000, 7)) | {cp for t in (CONTROL, PUNCTUATION, NONSPACING_MARK) for a, b in t
                                          for cp in (a - 1, a, b, b + 1)}
    cps = sorted(cp for cp in cps if 0 <= cp < 0x110000 and not 0xD800 <= cp < 0xE000 and cp not in (0, 0xFFFD))
    for cp in cps:
        c = chr(cp)
        assert (clean.normalize_str(c) == "") == in_ranges(CONTROL, cp), hex(cp)
        assert (len(bert.pre_tokenize_str(f"a{c}b")) == 3) == in_ranges(PUNCTUATION, cp), hex(cp)
        assert (strip.normalize_str(c) == "") == in_ranges(NONSPACING_MARK, cp), hex(cp)
    print(f"\ncharacter tables: {len(cps)} code points agree with the library")


@pytest.mark.parametrize("section,spec", [
    ("normalizer", {"type": "Precompiled", "precompiled_charsmap": ""}),
    ("pre_tokenizer", {"type": "Metaspace", "replacement": "▁"}),
    ("model", {"type": "Unigram", "vocab": []}),
    ("post_processor", {"type": "Nonsense"}),
    ("decoder", {"type": "Metaspace"}),
    ("truncation", {"max_length": 8}),
])
def test_unsupported_sections_are_refused(section, spec):
    base = {"normalizer": None, "pre_tokenizer": None, "post_processor": None, "decoder": None,
            "added_tokens": [], "model": {"type": "WordPiece", "vocab": {"[UNK]": 0}, "unk_token": "[UNK]"}}
    base[section] = spec
    with pytest.raises(ModelError) as e:
        Tokenizer.from_str(json.dumps(base))
    assert section in str(e.value) and (spec.get("type") or section) in str(e.value)


def test_build_copies_the_tokenizer_into_the_site(data, tmp_path):
    """`webiree build --tokenizer tokenizer.json` copies the file byte for byte and the manifest names it."""
    import onnx

    from webiree.cli import main
    from webiree.testing import models

    src = tmp_path / "my-tokenizer.json"
    byte_level_tokenizer(data["corpus"][:300], False, False).save(str(src))
    onnx.save(models.mlp(), str(tmp_path / "mlp.onnx"))
    out = tmp_path / "site"
    assert main(["build", str(tmp_path / "mlp.onnx"), "--out", str(out), "--no-validate",
                 "--tokenizer", str(src)]) == 0
    assert (out / "tokenizer.json").read_bytes() == src.read_bytes()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["files"]["tokenizer"] == "tokenizer.json"
    assert Tokenizer.from_file(out / "tokenizer.json").encode("hello world").ids


def test_build_refuses_a_file_that_is_not_a_tokenizer(tmp_path, capsys):
    import onnx

    from webiree.cli import main
    from webiree.testing import models

    onnx.save(models.mlp(), str(tmp_path / "mlp.onnx"))
    (tmp_path / "bad.json").write_text("[1, 2]")
    assert main(["build", str(tmp_path / "mlp.onnx"), "--out", str(tmp_path / "site"), "--no-validate",
                 "--tokenizer", str(tmp_path / "bad.json")]) == 2
    assert "not a Hugging Face tokenizer.json" in capsys.readouterr().err


def test_gpt2_split_classes_match_the_library():
    """ByteLevel's split (\\p{L}, \\p{N}, \\s from unicodedata) against the library's regex, every 7th
    code point this Python's Unicode database assigns (the library's tables may be newer)."""
    from tokenizers import pre_tokenizers

    from webiree.text.normalized import Piece
    from webiree.text.pre_tokenizers import ByteLevel

    ref = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    ours = ByteLevel({"add_prefix_space": False})
    n = 0
    for cp in range(0, 0x110000, 7):
        c = chr(cp)
        if 0xD800 <= cp < 0xE000 or unicodedata.category(c) == "Cn":
            continue
        for s in (f"a{c}1 {c}", f"{c}{c} x", f" {c}\n"):
            assert [w.text for w in ours(Piece.of(s))] == [t for t, _ in ref.pre_tokenize_str(s)], hex(cp)
        n += 1
    print(f"\nGPT-2 split: {n} code points agree with the library")
