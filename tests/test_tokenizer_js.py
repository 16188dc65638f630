"""web/tokenizer.js gives the same ids, offsets and decoded text as Hugging Face `tokenizers`.

The tokenizer.json files are trained here on a seeded multilingual corpus (no downloads):
a BERT-style WordPiece tokenizer and a GPT-2-style byte-level BPE tokenizer. One node
process encodes every test string with web/tokenizer.js and prints JSON; the library is
the reference.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from pathlib import Path

import pytest

import tokenizers  # noqa: E402  (the reference; set-up installs it)
from tokenizers import processors  # noqa: E402
from tokenizers.implementations import BertWordPieceTokenizer, ByteLevelBPETokenizer  # noqa: E402

NODE = shutil.which("node") or "/usr/bin/node"
WEB = Path(__file__).resolve().parents[1] / "web"
NODE_TIMEOUT_S = 120
N_STRINGS = 1200

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "hello", "world", "token", "izer",
         "running", "unbelievable", "don't", "it's", "we're", "I'm", "they've", "you'll", "he'd",
         "café", "naïve", "résumé", "über", "straße", "façade", "coöperate", "Ångström", "ÉCOLE",
         "données", "niño", "señor", "mañana", "İstanbul", "ΣΟΦΙΑ", "σοφία", "Москва", "привет",
         "東京", "日本語", "中文字符", "한국어", "ひらがな", "カタカナ", "مرحبا", "שלום", "नमस्ते", "ไทย",
         "😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇫🇷", "🥰", "𝒜𝓁𝓅𝒽𝒶", "𠀋", "𝟘𝟙", "½", "①", "Ⅻ"]
PUNCT = list(".,;:!?'\"()[]{}<>-_/\\|@#$%^&*+=~`") + ["...", "—", "–", "«", "»", "¿", "¡", "“", "”", "、", "。"]
SPACES = [" ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u3000", "\u2009", "\u200b", " \t \n"]
CONTROLS = ["\x00", "\x01", "\x07", "\x1b", "\x7f", "\u0085", "\u200d", "\ufeff", "\ufffd", "\u00ad", "\ue000"]
DECOMPOSED = ["cafe\u0301", "nai\u0308ve", "A\u030angstro\u0308m", "n\u0303", "e\u0301\u0301", "o\u0328\u0301"]
SPECIALS = ["[CLS]", "[SEP]", "[MASK]", "[UNK]", "<|endoftext|>", "[cls]"]


def corpus(rng: random.Random, n: int = 3000) -> list[str]:
    """Sentences of words, numbers and punctuation the tokenizers are trained on."""
    lines = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(3, 14)):
            r = rng.random()
            parts.append(rng.choice(WORDS) if r < 0.75 else str(rng.randint(0, 99999)) if r < 0.85
                         else rng.choice(PUNCT))
        lines.append(" ".join(parts))
    return lines


def sample_strings(rng: random.Random, n: int = N_STRINGS) -> list[str]:
    """Strings covering words, accents (composed and decomposed), CJK, emoji, whitespace runs,
    control characters, very long words, numbers, special tokens and the empty string."""
    fixed = ["", " ", "a", "Hello, world!", "  leading and trailing  ", "\t\n", "[CLS] hi [SEP]",
             "<|endoftext|>hello<|endoftext|>", "x" * 150, "ab" * 120, "1234567890" * 5, "東京は日本の首都です。",
             "👨‍👩‍👧‍👦👍🏽🏳️‍🌈", "café cafe\u0301", "\u3000全角\u3000スペース", "tab\there", "nbsp\u00a0here",
             "\x00\x01control\x7f", "İI ıi ΣΑΣ", "ﬁne ﬂow", "𝒜𝓁𝓅𝒽𝒶 𠀋𠀋", "can't won't shouldn't", "a\u0300\u0301b"]
    pools = [WORDS, PUNCT, SPACES, CONTROLS, DECOMPOSED, SPECIALS]
    weights = [50, 15, 15, 5, 5, 3]
    out = list(fixed)
    while len(out) < n:
        parts = []
        for _ in range(rng.randint(1, 20)):
            pool = rng.choices(pools, weights)[0]
            piece = rng.choice(pool)
            r = rng.random()
            if r < 0.05:
                piece = piece * rng.randint(20, 60)  # a very long word
            elif r < 0.15:
                piece = str(rng.randint(0, 10 ** rng.randint(1, 12)))
            elif r < 0.2:
                piece = piece.upper()
            parts.append(piece)
            if rng.random() < 0.6:
                parts.append(rng.choice([" ", " ", " ", "", rng.choice(SPACES)]))
        out.append("".join(parts))
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """{name: path of tokenizer.json} for the tokenizers under test."""
    rng = random.Random(1234)
    lines = corpus(rng)
    root = tmp_path_factory.mktemp("tokenizers")
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    paths = {}

    bert = BertWordPieceTokenizer()
    bert.train_from_iterator(lines, vocab_size=600, special_tokens=specials)
    bert.post_processor = processors.BertProcessing(("[SEP]", bert.token_to_id("[SEP]")),
                                                    ("[CLS]", bert.token_to_id("[CLS]")))
    bert.save(str(root / "bert.json"))
    paths["wordpiece-bert"] = root / "bert.json"

    cased = BertWordPieceTokenizer(lowercase=False, strip_accents=False)
    cased.train_from_iterator(lines, vocab_size=500, special_tokens=specials)
    cls, sep = cased.token_to_id("[CLS]"), cased.token_to_id("[SEP]")
    cased.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    cased.save(str(root / "cased.json"))
    paths["wordpiece-cased-template"] = root / "cased.json"

    gpt2 = ByteLevelBPETokenizer()
    gpt2.train_from_iterator(lines, vocab_size=800, special_tokens=["<|endoftext|>"])
    gpt2.save(str(root / "gpt2.json"))
    paths["bpe-bytelevel"] = root / "gpt2.json"
    legacy = json.loads((root / "gpt2.json").read_text(encoding="utf-8"))  # merges as "a b" strings
    legacy["model"]["merges"] = [" ".join(m) for m in legacy["model"]["merges"]]
    (root / "legacy.json").write_text(json.dumps(legacy), encoding="utf-8")
    paths["bpe-bytelevel-string-merges"] = root / "legacy.json"

    prefixed = ByteLevelBPETokenizer(add_prefix_space=True, trim_offsets=True)
    prefixed.train_from_iterator(lines, vocab_size=500, special_tokens=["<|endoftext|>"])
    prefixed.save(str(root / "prefixed.json"))
    paths["bpe-bytelevel-prefix-trim"] = root / "prefixed.json"
    return paths


def run_node(tmp_path: Path, jobs: dict) -> dict:
    """Encode and decode with web/tokenizer.js in one node process. jobs: {name: [json path, strings]}."""
    script = tmp_path / "encode.mjs"
    script.write_text(f"""
import {{readFileSync}} from 'node:fs';
import {{Tokenizer}} from '{(WEB / "tokenizer.js").as_uri()}';
const jobs = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const out = {{}};
for (const [name, [path, strings]] of Object.entries(jobs)) {{
  const tok = Tokenizer.fromJSON(readFileSync(path, 'utf8'));
  const t0 = performance.now();
  out[name] = {{results: strings.map((s) => {{
    const e = tok.encode(s);
    return {{ids: e.ids, offsets: e.offsets, typeIds: e.typeIds, mask: e.attentionMask, decoded: tok.decode(e.ids)}};
  }}), ms: performance.now() - t0}};
}}
process.stdout.write(JSON.stringify(out));
""", encoding="utf-8")
    data = tmp_path / "jobs.json"
    data.write_text(json.dumps({k: [str(p), s] for k, (p, s) in jobs.items()}), encoding="utf-8")
    proc = subprocess.run([NODE, str(script), str(data)], capture_output=True, text=True, timeout=NODE_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_tokenizer_js_matches_tokenizers(trained, tmp_path):
    strings = sample_strings(random.Random(99))
    assert len(strings) >= 1000 and "" in strings
    got = run_node(tmp_path, {name: (path, strings) for name, path in trained.items()})
    failures = []
    for name, path in trained.items():
        ref = tokenizers.Tokenizer.from_file(str(path))
        mismatches = []
        for s, js in zip(strings, got[name]["results"], strict=True):
            e = ref.encode(s)
            want = {"ids": e.ids, "offsets": [list(o) for o in e.offsets], "typeIds": e.type_ids,
                    "mask": e.attention_mask, "decoded": ref.decode(e.ids)}
            if js != want:
                mismatches.append((s, {k: (js[k], want[k]) for k in want if js[k] != want[k]}))
        print(f"\n{name}: {len(strings)} strings compared, {len(strings) - len(mismatches)} identical "
              f"(ids, offsets, type ids, mask, decode); node encoded them in {got[name]['ms']:.0f} ms")
        if mismatches:
            failures.append(f"{name}: {len(mismatches)} differ, first: {mismatches[:3]!r}")
    assert not failures, "\n".join(failures)


def node_eval(tmp_path: Path, body: str, args: list[str]):
    """Run `body` (an async function body with Tokenizer, readFileSync and argv in scope) in node; its JSON result."""
    script = tmp_path / "eval.mjs"
    script.write_text(f"""
import {{readFileSync}} from 'node:fs';
import {{Tokenizer, toUTF16Offsets, WebireeError}} from '{(WEB / "tokenizer.js").as_uri()}';
const argv = process.argv.slice(2);
const result = await (async () => {{ {body} }})();
process.stdout.write(JSON.stringify(result));
""", encoding="utf-8")
    proc = subprocess.run([NODE, str(script), *args], capture_output=True, text=True, timeout=NODE_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_pairs_match_tokenizers(trained, tmp_path):
    rng = random.Random(7)
    strings = sample_strings(rng, 200)
    pairs = [(strings[i], strings[-1 - i]) for i in range(100)]
    (tmp_path / "pairs.json").write_text(json.dumps(pairs), encoding="utf-8")
    for name in ("wordpiece-bert", "wordpiece-cased-template"):
        got = node_eval(tmp_path, """
          const tok = Tokenizer.fromJSON(readFileSync(argv[0], 'utf8'));
          return JSON.parse(readFileSync(argv[1], 'utf8')).map(([a, b]) => {
            const e = tok.encode(a, {pair: b});
            return [e.ids, e.offsets, e.typeIds, e.specialTokensMask];
          });""", [str(trained[name]), str(tmp_path / "pairs.json")])
        ref = tokenizers.Tokenizer.from_file(str(trained[name]))
        want = [[e.ids, [list(o) for o in e.offsets], e.type_ids, e.special_tokens_mask]
                for e in (ref.encode(a, b) for a, b in pairs)]
        assert got == want, name
        print(f"\n{name}: {len(pairs)} sentence pairs identical")


def test_offsets_slice_the_input(trained, tmp_path):
    """toUTF16Offsets turns the code point offsets into string indexes that cut out each token."""
    text = "Ça va? 👍🏽 東京 déjà"
    got = node_eval(tmp_path, """
      const tok = Tokenizer.fromJSON(readFileSync(argv[0], 'utf8'));
      const e = tok.encode(argv[1], {addSpecialTokens: false});
      return toUTF16Offsets(argv[1], e.offsets).map(([s, t]) => argv[1].slice(s, t));""",
                    [str(trained["bpe-bytelevel"]), text])
    ref = tokenizers.Tokenizer.from_file(str(trained["bpe-bytelevel"])).encode(text, add_special_tokens=False)
    assert got == [text[s:e] for s, e in ref.offsets]


@pytest.mark.parametrize("section, value, message", [
    ("normalizer", {"type": "Precompiled", "precompiled_charsmap": ""}, "normalizer of type 'Precompiled'"),
    ("pre_tokenizer", {"type": "Metaspace"}, "pre_tokenizer of type 'Metaspace'"),
    ("model", {"type": "Unigram", "vocab": []}, "model of type 'Unigram'"),
    ("post_processor", {"type": "Mystery"}, "post_processor of type 'Mystery'"),
    ("decoder", {"type": "Metaspace"}, "decoder of type 'Metaspace'"),
    ("truncation", {"max_length": 8}, "truncation is set"),
])
def test_unsupported_sections_throw_one_clear_error(trained, tmp_path, section, value, message):
    doc = json.loads(trained["wordpiece-bert"].read_text(encoding="utf-8"))
    doc[section] = value
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    got = node_eval(tmp_path, """
      try { Tokenizer.fromJSON(readFileSync(argv[0], 'utf8')); return null; }
      catch (e) { return [e instanceof WebireeError, e.kind, e.message]; }""", [str(path)])
    assert got is not None and got[:2] == [True, "tokenizer"] and message in got[2], got


def test_sites_carry_the_tokenizer(tmp_path):
    import webiree
    from webiree.testing import models

    webiree.compile(models.mlp(), tmp_path)
    for name in ("tokenizer.js", "tokenizer.d.ts"):
        assert (tmp_path / name).read_bytes() == (WEB / name).read_bytes()


def test_every_code_point_matches(trained, tmp_path):
    """Each code point alone, and between letters, encodes alike with the BERT tokenizer (the
    character classes of its normalizer and pre-tokenizer) and the byte-level BPE one."""
    chars = [chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF and (c < 0x32000 or c >= 0xE0000)]
    strings = ["".join(f"a{c} " for c in chars[i:i + 128]) for i in range(0, len(chars), 128)]
    got = run_node(tmp_path, {name: (trained[name], strings) for name in ("wordpiece-bert", "bpe-bytelevel")})
    for name in ("wordpiece-bert", "bpe-bytelevel"):
        ref = tokenizers.Tokenizer.from_file(str(trained[name]))
        bad = [s for s, js, e in zip(strings, got[name]["results"], ref.encode_batch(strings), strict=True)
               if js["ids"] != e.ids or js["offsets"] != [list(o) for o in e.offsets]]
        print(f"\n{name}: {len(chars)} code points in {len(strings)} strings, {len(strings) - len(bad)} identical")
        assert not bad, f"{name}: {len(bad)} strings differ, first code points: {[hex(ord(s[1])) for s in bad[:5]]}"
