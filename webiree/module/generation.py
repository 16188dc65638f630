"""The generation interface of a schedule module: which inputs and outputs a decoder built for
token-by-token generation has, and the checks every runtime makes before generating.

A decoder exported with a KV cache (transformers / optimum names) has

    inputs   input_ids [batch, sequence] (int64), attention_mask [batch, total] (optional),
             position_ids [batch, sequence] (optional),
             past_key_values.{i}.key / .value [batch, heads, past, head_dim] (one pair per layer)
    outputs  logits [batch, sequence, vocab], present.{i}.key / .value [batch, heads, past + sequence, head_dim]

A build with `generation=` (compiler/generation.py) appends a selection head to it, so that the
next token is picked on the GPU and only its id is read back:

    inputs   generation.k [1] (int64: 1 = greedy, else top-k sampling), generation.temperature [1]
             (float), generation.rng [1] (uint32: the sampler's state)
    outputs  generation.token [batch, 1] (int64: the next token), generation.rng_next [1] (uint32),
             generation.attention_mask_next [batch, total + 1], generation.position_ids_next [batch, 1]

Each step feeds the previous step's present.* as past_key_values.*, generation.rng_next as
generation.rng, and the *_next tensors, all GPU-resident; the host sends the token id (and the
symbols' values) and reads back generation.token. Standard library only (the Pyodide runtime).
"""

from __future__ import annotations

import re

from ..errors import FeedError, ModelError

INPUT_IDS, ATTENTION_MASK, POSITION_IDS, LOGITS = "input_ids", "attention_mask", "position_ids", "logits"
K, TEMPERATURE, RNG = "generation.k", "generation.temperature", "generation.rng"
TOKEN, RNG_NEXT = "generation.token", "generation.rng_next"
MASK_NEXT, POSITIONS_NEXT = "generation.attention_mask_next", "generation.position_ids_next"
HEAD_INPUTS = (K, TEMPERATURE, RNG)
HEAD_OUTPUTS = (TOKEN, RNG_NEXT, MASK_NEXT, POSITIONS_NEXT)
PAST = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")
PRESENT = re.compile(r"^present\.(\d+)\.(key|value)$")
TOP_K_INFO = "generation_top_k"     # module.info: the largest k the build samples from (0: greedy only)

# the sampler's generator: a 32-bit LCG (Numerical Recipes' constants) on the GPU, seeded on the host
LCG_A, LCG_C = 1664525, 1013904223
ACCEPTS = ("a decoder with inputs input_ids, attention_mask (optional), position_ids (optional) and "
           "past_key_values.{i}.key/value, and outputs logits and present.{i}.key/value")


def past_names(names) -> list:
    """The past_key_values.{i}.key/value names among `names`, by layer, key before value."""
    found = [(int(m.group(1)), m.group(2) == "value", n) for n in names for m in [PAST.match(n)] if m]
    return [n for _, _, n in sorted(found)]


def present_of(past: str) -> str:
    m = PAST.match(past)
    return f"present.{m.group(1)}.{m.group(2)}"


def check_decoder(inputs, outputs, where: str = "the model") -> list:
    """Check a decoder's input and output names (before the head is appended); returns its past
    inputs in order. ModelError naming what is missing or what generation cannot feed."""
    inputs, outputs = list(inputs), list(outputs)
    past = past_names(inputs)
    problems = []
    if INPUT_IDS not in inputs:
        problems.append("it has no input_ids input")
    if LOGITS not in outputs:
        problems.append("it has no logits output")
    if not past:
        problems.append("it has no past_key_values.{i}.key/value inputs (a KV cache)")
    missing = [present_of(p) for p in past if present_of(p) not in outputs]
    if missing:
        problems.append(f"outputs {missing} are missing (each past_key_values.{{i}}.key/value needs its present)")
    layers = {PAST.match(p).group(1) for p in past}
    unpaired = sorted(f"past_key_values.{i}.{kv}" for i in layers for kv in ("key", "value")
                      if f"past_key_values.{i}.{kv}" not in inputs)
    if unpaired:
        problems.append(f"inputs {unpaired} are missing (keys and values come in pairs)")
    known = {INPUT_IDS, ATTENTION_MASK, POSITION_IDS, *past, *HEAD_INPUTS}
    other = [n for n in inputs if n not in known]
    if other:
        problems.append(f"inputs {other} are not ones generation knows how to feed")
    if problems:
        raise ModelError(f"{where} cannot generate: " + "; ".join(problems),
                         hint=f"generation takes {ACCEPTS} (a merged decoder with use_cache_branch, or an "
                              "encoder-decoder, is not supported yet)")
    return past


def check_module(module) -> dict:
    """What a runtime needs to generate with `module` (a schedule module with the head), or a
    ModelError saying why it cannot: {'past': [past input names], 'top_k': largest k, 'inputs':
    {name: io}, 'outputs': {name: io}}."""
    ins = {io.name: io for io in module.inputs}
    outs = {io.name: io for io in module.outputs}
    need_out = [TOKEN, RNG_NEXT] + ([MASK_NEXT] if ATTENTION_MASK in ins else []) + \
        ([POSITIONS_NEXT] if POSITION_IDS in ins else [])
    missing = [n for n in HEAD_INPUTS if n not in ins] + [n for n in need_out if n not in outs]
    if missing:
        past = past_names(ins)
        reason = "it has no generation head" if past else "it is not a decoder with a KV cache"
        raise ModelError(f"this build cannot generate: {reason} (missing {missing})",
                         hint="build the decoder with webiree.compile(model, out, dims=..., generation=True) "
                              f"(`webiree build --generation`); generation takes {ACCEPTS}")
    past = check_decoder(list(ins), list(outs), "this build")
    batch_reg = ins[INPUT_IDS].regs[0] if ins[INPUT_IDS].regs else None
    if ins[INPUT_IDS].shape[0] != 1 and batch_reg is None:
        raise ModelError(f"this build fixes the batch at {ins[INPUT_IDS].shape[0]}; generation runs one sequence",
                         hint="build it with the batch dim at 1 (dims={'batch': 1})")
    return {"past": past, "top_k": int((module.info or {}).get(TOP_K_INFO, 0)), "inputs": ins, "outputs": outs}


def empty_past_shape(module, io) -> tuple:
    """The shape of a past input of length 0 in batch 1: its fixed dims, 1 for the batch (the
    symbol of input_ids' first dim), 0 for every other symbolic dim (the past length)."""
    ids = next(i for i in module.inputs if i.name == INPUT_IDS)
    batch_reg = ids.regs[0] if ids.regs else None
    if not io.regs:
        raise ModelError(f"input {io.name!r} has the fixed shape {list(io.shape)}; the past length must vary",
                         hint="build with a range for the past length, e.g. dims={'past_sequence': (0, 127)}")
    return tuple(d if r is None else (1 if r == batch_reg else 0) for d, r in zip(io.shape, io.regs))


STRATEGIES = ("greedy", "top-k")


def check_options(prompt, max_new_tokens, strategy, k, temperature, top_k) -> int:
    """Check generate()'s arguments (the same words in every runtime); returns the k fed to the
    head (1 for greedy)."""
    if len(prompt) < 1:
        raise FeedError("the prompt is empty", hint="give at least one token id")
    if any(not isinstance(t, int) or isinstance(t, bool) for t in prompt):
        raise FeedError("the prompt must be a list of int token ids")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise FeedError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if strategy not in STRATEGIES:
        raise FeedError(f"unknown strategy {strategy!r}", hint="use 'greedy' or 'top-k'")
    if strategy == "greedy":
        return 1
    if not isinstance(k, int) or k < 1:
        raise FeedError(f"top-k sampling needs k >= 1, got {k!r}")
    if top_k < 1:
        raise FeedError("this build samples no top-k (its generation head is greedy only)",
                        hint="rebuild with generation=N (top-k up to N), or use strategy='greedy'")
    if k > top_k:
        raise FeedError(f"k={k} is above the build's top-k limit of {top_k}",
                        hint=f"use k <= {top_k}, or rebuild with generation={k}")
    if not isinstance(temperature, (int, float)) or not temperature > 0:
        raise FeedError(f"temperature must be > 0, got {temperature!r}")
    return k


def seed_state(seed) -> int:
    """The sampler's first state from a seed (any int): the same in every runtime."""
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise FeedError(f"seed must be an int, got {seed!r}")
    return (seed * 2654435761 + 0x9E3779B9) & 0xFFFFFFFF
