"""Token-by-token generation over the schedule interpreter, written once for every Python runtime
(natively under run_sync, in Pyodide awaited); web/webiree.js has the same loop in JavaScript.

The module is a decoder built with the generation head (module/generation.py). Step 1 feeds the
prompt with an empty past (length 0), as merged decoders are run with onnxruntime; every later
step feeds the new token id from the host and, GPU-resident, the previous step's present.* as
past_key_values.*, its generation.attention_mask_next / position_ids_next and the sampler's
state. Each step keeps those outputs on the GPU and reads back generation.token only: 4 bytes.
k and temperature are uploaded once per generation. Standard library only.
"""

from __future__ import annotations

from ..errors import FeedError
from ..module import generation as G
from .feeds import bind_dims, encode_input
from .interpreter import DeviceTensor


def _shapes_fit(module, shapes: dict, what: str, n: int, new: int) -> None:
    try:
        bind_dims(module, shapes)
    except FeedError as e:
        raise FeedError(f"a prompt of {n} tokens and {new} new tokens do not fit this build ({what}: {e.message})",
                        hint="give a shorter prompt or fewer new tokens, or rebuild with wider ranges "
                             "(e.g. dims={'past_sequence': (0, N - 1), 'total_sequence': (1, N)})") from None


class Generation:
    """The state of one generation on `interp`; `await step()` returns the next token id."""

    def __init__(self, interp, prompt, max_new_tokens: int, strategy: str = "greedy", k: int = 50, seed: int = 0,
                 temperature: float = 1.0):
        m = interp.m
        info = G.check_module(m)
        prompt = [int(t) if not isinstance(t, bool) and hasattr(t, "__index__") else t for t in prompt]
        k_fed = G.check_options(prompt, max_new_tokens, strategy, k, temperature, info["top_k"])
        state = G.seed_state(seed)
        self.interp, self.m, self.info = interp, m, info
        ins = info["inputs"]
        self.past = info["past"]
        self.has_mask, self.has_pos = G.ATTENTION_MASK in ins, G.POSITION_IDS in ins
        n = len(prompt)
        self.empty = {p: G.empty_past_shape(m, ins[p]) for p in self.past}
        self.axis = {p: next(i for i, (e, r) in enumerate(zip(self.empty[p], ins[p].regs))
                             if r is not None and e == 0) for p in self.past}
        first = self._shapes(n, 0)
        _shapes_fit(m, first, "the first step", n, max_new_tokens)
        if max_new_tokens > 1:
            _shapes_fit(m, self._shapes(1, n + max_new_tokens - 2), "the last step", n, max_new_tokens)
        self.keep = [G.present_of(p) for p in self.past] + [G.RNG_NEXT] + \
            ([G.MASK_NEXT] if self.has_mask else []) + ([G.POSITIONS_NEXT] if self.has_pos else [])
        self.outputs = [G.TOKEN] + self.keep
        self.held = []            # device tensors of this generation, released by close()
        up = interp.upload
        self.const = {G.K: self._hold(up(G.K, encode_input(ins[G.K], [k_fed]), (1,))),
                      G.TEMPERATURE: self._hold(up(G.TEMPERATURE, encode_input(ins[G.TEMPERATURE],
                                                                               [float(temperature)]), (1,))),
                      G.RNG: self._hold(up(G.RNG, encode_input(ins[G.RNG], [state]), (1,)))}
        ids = ins[G.INPUT_IDS]
        self.feeds = {G.INPUT_IDS: encode_input(ids, prompt, None, (1, n))}
        if self.has_mask:
            self.feeds[G.ATTENTION_MASK] = encode_input(ins[G.ATTENTION_MASK], [1] * n, None, (1, n))
        if self.has_pos:
            self.feeds[G.POSITION_IDS] = encode_input(ins[G.POSITION_IDS], list(range(n)), None, (1, n))
        for p in self.past:
            self.feeds[p] = b""
        self.feeds.update(self.const)
        self.shapes = first
        self.steps = 0
        self.remaining = max_new_tokens

    def _hold(self, t: DeviceTensor) -> DeviceTensor:
        self.held.append(t)
        return t

    def _shapes(self, seq: int, past: int) -> dict:
        shapes = {G.INPUT_IDS: (1, seq), G.K: (1,), G.TEMPERATURE: (1,), G.RNG: (1,)}
        if self.has_mask:
            shapes[G.ATTENTION_MASK] = (1, past + seq)
        if self.has_pos:
            shapes[G.POSITION_IDS] = (1, seq)
        for p in self.past:
            s = list(self.empty[p])
            s[self.axis[p]] = past
            shapes[p] = tuple(s)
        return shapes

    async def step(self) -> int | None:
        """Run one step; the new token id, or None once max_new_tokens were generated."""
        if self.remaining <= 0:
            return None
        raw, _ = await self.interp.run_raw(self.feeds, False, self.keep, self.outputs, self.shapes)
        token = int.from_bytes(raw[G.TOKEN][:4], "little", signed=True)
        fed = [v for n, v in self.feeds.items() if isinstance(v, DeviceTensor) and n not in (G.K, G.TEMPERATURE)]
        for t in fed:
            t.release()
        self.held = [t for t in self.held if not t.released] + [raw[n] for n in self.keep]
        self.steps += 1
        self.remaining -= 1
        ins = self.info["inputs"]
        self.feeds = {G.INPUT_IDS: encode_input(ins[G.INPUT_IDS], [token], None, (1, 1)),
                      G.K: self.const[G.K], G.TEMPERATURE: self.const[G.TEMPERATURE], G.RNG: raw[G.RNG_NEXT]}
        for p in self.past:
            self.feeds[p] = raw[G.present_of(p)]
        if self.has_mask:
            self.feeds[G.ATTENTION_MASK] = raw[G.MASK_NEXT]
        if self.has_pos:
            self.feeds[G.POSITION_IDS] = raw[G.POSITIONS_NEXT]
        self.shapes = {G.INPUT_IDS: (1, 1)}
        return token

    def close(self) -> None:
        """Free every device tensor this generation holds (idempotent)."""
        for t in self.held:
            t.release()
        self.held = []
        self.feeds = {}
        self.remaining = 0


async def generate_tokens(interp, prompt, max_new_tokens: int, strategy: str = "greedy", k: int = 50,
                          seed: int = 0, temperature: float = 1.0, eos_token_id=None):
    """Async generator of the new token ids (stops after max_new_tokens or at eos_token_id, which
    is yielded); the GPU tensors are freed when it finishes or is closed."""
    gen = Generation(interp, prompt, max_new_tokens, strategy, k, seed, temperature)
    try:
        while True:
            token = await gen.step()
            if token is None:
                return
            yield token
            if eos_token_id is not None and token == eos_token_id:
                return
    finally:
        gen.close()
