"""Small text models with real tokenizers, for the text pages' demos (demo/build.py) and tests.

Each tokenizer.json is trained here with the `tokenizers` library on CORPUS, a little English text
written in this file (no downloads): a BERT-style WordPiece tokenizer (lowercasing, [CLS] ... [SEP])
for the encoder, a GPT-2-style byte-level BPE (<|endoftext|>) for the decoder. The models are
`transformers` models with seeded random weights and the tokenizer's vocabulary size
(models.export_bert_dynamic, models.export_gpt2_with_past), exported to ONNX. Needs tokenizers,
torch and transformers (the models extra). Training and export are deterministic.
"""

from __future__ import annotations

from pathlib import Path

CORPUS = """\
The little robot woke up early and looked out of the window at the quiet town.
A man is playing a guitar on the stage while the crowd sings along.
Someone plays music in front of a large audience in the park.
The weather was cold, so she made a cup of tea and read a book by the fire.
Two children are running across the field with a red kite.
The train to the city leaves at seven in the morning and arrives before noon.
He fixed the old bicycle with a wrench, some oil and a lot of patience.
Scientists measured the temperature of the ocean for many years.
The cat slept on the warm roof while the dog barked at the birds.
Once upon a time, a small dragon lived in a cave under the mountain.
She wrote a letter to her friend about the long journey across the sea.
The market was full of fresh bread, apples, cheese and flowers.
A woman is slicing vegetables in the kitchen for dinner.
The computer program compiles the model ahead of time and runs it on the GPU.
Every night the lighthouse sends its light over the dark water.
They walked along the river and talked about music, books and the future.
The teacher explained how plants turn sunlight into energy.
A group of friends is hiking up a steep trail in the forest.
The storm passed quickly, and the sky was clear and blue again.
My grandmother baked a cake with chocolate and strawberries for the party.
The engineer tested the bridge before the first cars drove over it.
In the evening the streets were quiet and the lamps were bright.
A young boy is learning to swim in the lake with his father.
The museum shows paintings, old maps and the bones of a dinosaur.
We planted tomatoes, beans and sunflowers in the garden this spring.
The pilot said the flight would be smooth and short today.
Reading a good story can take you to places you have never been.
The orchestra played a slow song, and then a fast and happy one.
A dog is catching a ball on the beach near the waves.
The baker opens the shop at dawn, when the town is still asleep.
What a wonderful day! Is it 3 o'clock already? Yes: 10, 20 or 42 (maybe 7), said Anna; "don't be late" - it's 5 or 6 km & 89 %.
Questions, answers and numbers: 0 1 2 3 4 5 6 7 8 9 ... #1 @home $100 [note] {x} <tag> / \\ | _ = + * ~ ^ `code`.
"""

WORDPIECE_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
EOS = "<|endoftext|>"


def _rename(onnx_path, name: str) -> None:
    """Name the exported graph (torch calls every graph main_graph): the site shows it as the model's name."""
    import onnx

    m = onnx.load(str(onnx_path))
    m.graph.name = name
    onnx.save(m, str(onnx_path))


def corpus_lines() -> list[str]:
    return [line for line in CORPUS.splitlines() if line.strip()]


def wordpiece_tokenizer(path, vocab_size: int = 600) -> int:
    """Train a BERT-style WordPiece tokenizer (lowercased, accents stripped, [CLS] $A [SEP]) on
    CORPUS and save it as a tokenizer.json at `path`. Returns its vocabulary size."""
    from tokenizers import processors
    from tokenizers.implementations import BertWordPieceTokenizer

    tok = BertWordPieceTokenizer()
    tok.train_from_iterator(corpus_lines() * 4, vocab_size=vocab_size, special_tokens=WORDPIECE_SPECIALS)
    tok.post_processor = processors.BertProcessing(("[SEP]", tok.token_to_id("[SEP]")),
                                                   ("[CLS]", tok.token_to_id("[CLS]")))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return tok.get_vocab_size()


def bpe_tokenizer(path, vocab_size: int = 600) -> int:
    """Train a GPT-2-style byte-level BPE tokenizer (256 byte tokens, merges, <|endoftext|> as id 0)
    on CORPUS and save it as a tokenizer.json at `path`. Returns its vocabulary size."""
    from tokenizers.implementations import ByteLevelBPETokenizer

    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(corpus_lines() * 4, vocab_size=vocab_size, special_tokens=[EOS])
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return tok.get_vocab_size()


EMBEDDER_MAX_LENGTH = 128
EMBEDDER_DIMS = {"batch": 1, "sequence": (1, EMBEDDER_MAX_LENGTH)}


def export_embedder(onnx_path, tokenizer_path, seed: int = 0) -> dict:
    """A WordPiece tokenizer and a BERT encoder (transformers BertModel, hidden 64, 2 layers, 4 heads,
    128 positions, random seeded weights) of its vocabulary, exported with symbolic batch and sequence.
    Build it with dims=EMBEDDER_DIMS. Returns {"vocab_size", "inputs"}."""
    from .models import export_bert_dynamic

    vocab = wordpiece_tokenizer(tokenizer_path)
    names = export_bert_dynamic(onnx_path, seed=seed, hidden=64, layers=2, heads=4,
                                max_positions=EMBEDDER_MAX_LENGTH, vocab_size=vocab)
    _rename(onnx_path, "tiny BERT, random weights")
    return {"vocab_size": vocab, "inputs": names}


def export_generator(onnx_path, tokenizer_path, seed: int = 2, std: float = 0.5) -> dict:
    """A byte-level BPE tokenizer and a GPT-2 decoder with a KV cache (models.export_gpt2_with_past:
    2 layers, 64 wide, 4 heads, 128 positions, random seeded weights N(0, std); this seed and std give
    a greedy decode that does not repeat one token) of its vocabulary. Build it with
    dims=models.GPT2_DIMS and generation=True. Returns {"vocab_size", "eos_token_id", "inputs"}."""
    from .models import export_gpt2_with_past

    vocab = bpe_tokenizer(tokenizer_path)
    names = export_gpt2_with_past(onnx_path, seed=seed, vocab=vocab, std=std)
    _rename(onnx_path, "tiny GPT-2, random weights")
    return {"vocab_size": vocab, "eos_token_id": 0, "inputs": names}
