"""What a site's page is for: the task, picked from the model's inputs and outputs or named with
`--task`, and recorded in the manifest.

    text-embedding        a BERT-class encoder: inputs input_ids [batch, sequence] (int), and
                          optionally attention_mask and token_type_ids of the same shape; an output of
                          rank 3 [batch, sequence, hidden] (float32; last_hidden_state or token_embeddings
                          when the task is picked by itself); a tokenizer (--tokenizer). The page: two
                          sentences -> token ids -> mean-pooled, L2-normalized embeddings, their cosine
                          similarity (bundler/pages.py).
    text-generation       a decoder built with the generation head (--generation) and a tokenizer: a
                          prompt -> token ids streamed into the page as they are generated, tokens/s.
    image-classification  one static float32 input [1, 3, H, W] and a float32 output [1, N]: the generic
                          page, with an image picker and the top-5 classes.
    image-segmentation    one static float32 input [1, 3, H, W] and a float32 output [1, C, H', W']: the
                          generic page, with the argmax mask drawn.
    generic               anything: the generic page (token ids typed, or the sample input; outputs
                          summarized).

Picked by itself, the task is the first of that list (generation first) that fits; a text task needs
the tokenizer. A task named with `--task` that does not fit is one ModelError naming what it needs and
what the model has.

The manifest's "task" is {"name": ...} plus, for the text tasks, what the page needs:
  text-embedding:  "max_length" (tokens per sentence: the sequence dim's largest size), "padded" (the
                   sequence dim is fixed: the page pads with the tokenizer's [PAD] / id 0 and a mask of 0),
                   "inputs" {"input_ids", "attention_mask", "token_type_ids": name or null}, "output",
                   "pooling": "mean", "normalize": true
  text-generation: "max_length" (prompt + new tokens at most), "max_prompt" (prompt tokens at most),
                   "top_k" (the build's top-k limit; 0: greedy only)
"""

from __future__ import annotations

from ..dtypes import name_of
from ..errors import ModelError

TASKS = ("text-embedding", "text-generation", "image-classification", "image-segmentation", "generic")
TEXT_TASKS = ("text-embedding", "text-generation")
AUTO_ORDER = ("text-generation", "text-embedding", "image-classification", "image-segmentation", "generic")

EMBEDDING_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
EMBEDDING_OUTPUTS = ("last_hidden_state", "token_embeddings")   # picked by name when the task is not named
INT_TYPES = ("int64", "int32")
MASK_TYPES = ("int64", "int32", "float32", "bool")
GEN_TOP_K = "generation_top_k"       # module.info (module/generation.py TOP_K_INFO)
GEN_TOKEN = "generation.token"

NEEDS = {
    "text-embedding": "an encoder with inputs input_ids [batch, sequence] (int64 or int32) and optionally "
                      "attention_mask and token_type_ids of that shape, nothing else, a batch that can be 1, "
                      "a float32 output [batch, sequence, hidden] (last_hidden_state), and --tokenizer",
    "text-generation": "a decoder with a KV cache built with --generation (the generation head) and --tokenizer",
    "image-classification": "one float32 input [1, 3, H, W] of fixed size and a float32 output [1, N]",
    "image-segmentation": "one float32 input [1, 3, H, W] of fixed size and a float32 output [1, C, H', W']",
    "generic": "any model",
}


def check_task_name(task) -> None:
    if task is not None and task not in TASKS:
        raise ModelError(f"unknown task {task!r}", hint=f"use one of {', '.join(TASKS)} (or none: picked by the model)")


def check_task_options(task, tokenizer: bool, generation: bool) -> None:
    """Fail before compiling when a named task lacks a build option it needs."""
    check_task_name(task)
    missing = []
    if task == "text-generation" and not generation:
        missing.append("--generation (generation=True)")
    if task in TEXT_TASKS and not tokenizer:
        missing.append("--tokenizer tokenizer.json")
    if missing:
        raise ModelError(f"--task {task} needs {' and '.join(missing)}: the page needs {NEEDS[task]}",
                         hint=f"build with {' '.join(missing)}, or leave --task out (the page is then picked by the model)")


def _range(module, io, axis: int) -> tuple[int, int]:
    """The sizes one dim of an input or output takes: (n, n) where fixed, its symbol's range where it varies."""
    reg = io.regs[axis] if io.regs else None
    if reg is None or reg >= len(module.symbols):
        return int(io.shape[axis]), int(io.shape[axis])
    _, lo, hi = module.symbols[reg]
    return int(lo), int(hi)


def _is_float(io) -> bool:
    return name_of(io.onnx_type) == "float32"


def _embedding(module, tokenizer: bool, named: bool):
    ins = {io.name: io for io in module.inputs}
    if "input_ids" not in ins:
        return None, "it has no input input_ids"
    other = [n for n in ins if n not in EMBEDDING_INPUTS]
    if other:
        return None, f"it has other inputs {other}"
    ids = ins["input_ids"]
    if name_of(ids.onnx_type) not in INT_TYPES or len(ids.shape) != 2:
        return None, f"input_ids is {name_of(ids.onnx_type)} {list(ids.shape)}, not int64/int32 [batch, sequence]"
    for n in ("attention_mask", "token_type_ids"):
        io = ins.get(n)
        types = MASK_TYPES if n == "attention_mask" else INT_TYPES
        if io is not None and (name_of(io.onnx_type) not in types or len(io.shape) != 2):
            return None, f"{n} is {name_of(io.onnx_type)} {list(io.shape)}, not {'/'.join(types)} [batch, sequence]"
    lo, hi = _range(module, ids, 0)
    if not lo <= 1 <= hi:
        return None, f"its batch is {lo if lo == hi else f'{lo}..{hi}'}, not 1"
    rank3 = [io for io in module.outputs if _is_float(io) and len(io.shape) == 3]
    out = next((io for n in EMBEDDING_OUTPUTS for io in rank3 if io.name == n), None)
    if out is None and named and rank3:
        out = rank3[0]
    if out is None:
        return None, ("it has no float32 output [batch, sequence, hidden] named " + " or ".join(EMBEDDING_OUTPUTS)
                      if rank3 else "it has no float32 output [batch, sequence, hidden]")
    if not tokenizer:
        return None, "the build has no tokenizer (--tokenizer)"
    seq_lo, seq_hi = _range(module, ids, 1)
    return {"name": "text-embedding", "max_length": seq_hi, "padded": seq_lo == seq_hi,
            "inputs": {n: (n if n in ins else None) for n in EMBEDDING_INPUTS}, "output": out.name,
            "pooling": "mean", "normalize": True}, None


def _generation(module, tokenizer: bool, named: bool):
    if GEN_TOP_K not in module.info or GEN_TOKEN not in {io.name for io in module.outputs}:
        return None, "it was not built with the generation head (--generation)"
    if not tokenizer:
        return None, "the build has no tokenizer (--tokenizer)"
    ins = {io.name: io for io in module.inputs}
    seq_hi = _range(module, ins["input_ids"], 1)[1]
    # generating N tokens after a prompt of n runs N steps; the last feeds token N-1 with a past of
    # n + N - 2 and a mask of n + N - 1: so n + N <= min(past max + 2, mask max + 1)
    caps = [_range(module, io, 2)[1] + 2 for io in module.inputs if io.name.startswith("past_key_values.")]
    prompt_caps = [seq_hi]
    if "attention_mask" in ins:
        mask_hi = _range(module, ins["attention_mask"], 1)[1]
        caps.append(mask_hi + 1)
        prompt_caps.append(mask_hi)
    max_length = min(caps) if caps else seq_hi + 1
    return {"name": "text-generation", "max_length": max_length, "max_prompt": min(prompt_caps + [max_length - 1]),
            "top_k": int(module.info[GEN_TOP_K])}, None


def _image_input(module):
    if len(module.inputs) != 1:
        return None, f"it has {len(module.inputs)} inputs, not one image"
    io = module.inputs[0]
    if not _is_float(io) or len(io.shape) != 4 or io.shape[0] != 1 or io.shape[1] != 3 or io.dynamic:
        return None, f"its input {io.name} is {name_of(io.onnx_type)} {list(io.shape)}{' (of varying size)' if io.dynamic else ''}, not float32 [1, 3, H, W]"
    return io, None


def _classification(module, tokenizer: bool, named: bool):
    io, why = _image_input(module)
    if io is None:
        return None, why
    if not any(_is_float(o) and len(o.shape) == 2 and o.shape[0] == 1 and o.shape[1] > 1 for o in module.outputs):
        return None, "it has no float32 output [1, N]"
    return {"name": "image-classification"}, None


def _segmentation(module, tokenizer: bool, named: bool):
    io, why = _image_input(module)
    if io is None:
        return None, why
    if not any(_is_float(o) and len(o.shape) == 4 and o.shape[0] == 1 and o.shape[1] > 1 and o.shape[2] * o.shape[3] > 1
               for o in module.outputs):
        return None, "it has no float32 output [1, C, H', W']"
    return {"name": "image-segmentation"}, None


FITS = {"text-embedding": _embedding, "text-generation": _generation, "image-classification": _classification,
        "image-segmentation": _segmentation, "generic": lambda module, tokenizer, named: ({"name": "generic"}, None)}


def describe_io(module) -> str:
    show = lambda ios: ", ".join(f"{io.name} {name_of(io.onnx_type)} {list(io.shape)}" for io in ios)  # noqa: E731
    return f"inputs [{show(module.inputs)}], outputs [{show(module.outputs)}]"


def pick_task(module, task: str | None = None, tokenizer: bool = False) -> dict:
    """The manifest's "task" for a compiled module: the named task (ModelError when it does not fit),
    or the first of AUTO_ORDER that fits."""
    check_task_name(task)
    if task is not None:
        info, why = FITS[task](module, tokenizer, True)
        if info is None:
            raise ModelError(f"--task {task} does not fit this model: {why}; the task needs {NEEDS[task]}",
                             hint=f"the model has {describe_io(module)}; leave --task out to let the model pick the page")
        return info
    for name in AUTO_ORDER:
        info, _ = FITS[name](module, tokenizer, False)
        if info is not None:
            return info
    raise AssertionError("generic fits every model")
