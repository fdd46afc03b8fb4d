"""Samplers: token ids in, sampled token ids + per-token logprobs + finish reason out.

Logprob definition: for each sampled token, ``log softmax(logits / temperature)[token]`` —
the log-probability under the distribution the token was actually drawn from (temperature
applied, no top-k/top-p truncation). A learner that recomputes logprobs at temperature 1.0
must apply the same temperature to compare them.

The protocol is asynchronous: the episode runner awaits `sample(request)` from many episodes
at once, and a batching backend (`tracerl.rollout.batched.BatchedHFSampler`) serves the
requests that are waiting together with one batched forward pass. Every result is stamped
with the sampler's `policy_version` at the time it was sampled.

A request may carry a `seed`: then its tokens depend only on that seed (and the weights), not
on which other requests happened to share its batch. This is what makes an episode
reproducible under concurrency.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


def draw(logp_B_V: Any, uniforms_B: Any) -> Any:
    """Inverse-CDF sampling: row b's token is the first whose cumulative probability reaches
    ``uniforms_B[b]`` of the row's total. One uniform per row (drawn from that request's own
    generator, so a seeded request's tokens do not depend on its batch), one cumsum and one
    search for the whole batch — instead of an exponential draw over the 49k vocabulary per
    row, which `torch.multinomial` makes. Both samplers use it, so they agree token for token.
    """
    import torch

    cdf_B_V = logp_B_V.exp().cumsum(-1)
    target_B_1 = uniforms_B[:, None].to(cdf_B_V.dtype) * cdf_B_V[:, -1:]
    idx_B = torch.searchsorted(cdf_B_V, target_B_1)[:, 0]
    return idx_B.clamp(max=cdf_B_V.shape[-1] - 1)


@dataclass(frozen=True)
class SampleRequest:
    """One model turn to sample.

    Attributes:
        prompt_ids: the conversation so far (the sampler continues from exactly these tokens).
        max_tokens: the most tokens to sample, stop token included.
        stop_token_ids: sampling stops after any of these (it is included in the result).
        seed: per-request RNG seed; None draws from the sampler's own generator.
        episode_id: which episode asks (scripted samplers use it to pick a script).
        turn: the episode's turn index (0 for the first model turn).
        last: no model turn of its episode can follow (its step budget ends with this one):
            a sampler keeps nothing of it for a next turn (prefix caching). A single-turn
            task's every request: GRPO on math keeps no row's keys and values.
    """

    prompt_ids: tuple[int, ...]
    max_tokens: int
    stop_token_ids: frozenset[int] = field(default_factory=frozenset)
    seed: int | None = None
    episode_id: str | None = None
    turn: int = 0
    last: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_ids", tuple(self.prompt_ids))
        object.__setattr__(self, "stop_token_ids", frozenset(self.stop_token_ids))
        if self.max_tokens < 1:
            raise ValueError(f"sample request: max_tokens must be >= 1, got {self.max_tokens}")
        if not self.prompt_ids:
            raise ValueError("sample request: prompt_ids is empty; render a prompt first")


@dataclass(frozen=True)
class SampleResult:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (a stop token was sampled, and is included) or "length"
    policy_version: int


class SamplerUnavailable(RuntimeError):
    """The generation backend could not be reached or kept failing (a remote server down,
    overloaded, timing out): infrastructure, so the episode is the environment's."""


class Sampler(Protocol):
    """What the episode runner needs from a policy backend."""

    policy_version: int

    async def sample(self, request: SampleRequest) -> SampleResult: ...


def _cache_keyword(model: Any) -> str:
    """transformers >= 5.2x names the KV cache `cache`; older releases `past_key_values`.
    A `peft` wrapper forwards `**kwargs`: the wrapped model's signature decides."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    params = inspect.signature(base.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class HFSampler:
    """Ancestral sampling from a causal LM with a KV cache, one sequence at a time.

    The plain reference implementation: `generate` is synchronous, `sample` runs it in a
    worker thread so the event loop (and the environments) keep going meanwhile. Concurrent
    requests are served one after another; use `BatchedHFSampler` to serve them together.
    """

    def __init__(
        self, model: Any, *, temperature: float = 1.0, seed: int = 0, policy_version: int = 0
    ) -> None:
        import torch

        if temperature <= 0:
            raise ValueError("temperature must be > 0 (use a small value for near-greedy)")
        self.model = model
        self.temperature = temperature
        self.policy_version = policy_version
        self.generator = torch.Generator().manual_seed(seed)
        self._cache_kw = _cache_keyword(model)
        self._locks: dict[int, asyncio.Lock] = {}  # one per event loop (asyncio.run makes new)

    async def sample(self, request: SampleRequest) -> SampleResult:
        loop = id(asyncio.get_running_loop())
        if loop not in self._locks:
            self._locks = {loop: asyncio.Lock()}  # an old loop's lock is never used again
        async with self._locks[loop]:  # one sequence at a time: the model is not re-entrant
            return await asyncio.to_thread(
                self.generate,
                request.prompt_ids,
                max_tokens=request.max_tokens,
                stop_token_ids=request.stop_token_ids,
                seed=request.seed,
            )

    def generate(
        self,
        prompt_ids: Sequence[int],
        *,
        max_tokens: int,
        stop_token_ids: Iterable[int],
        seed: int | None = None,
    ) -> SampleResult:
        import torch

        from tracerl.models.placement import computing, device_of

        dev = device_of(self.model)
        gen = self.generator if seed is None else torch.Generator().manual_seed(seed)
        stops = set(stop_token_ids)
        out: list[int] = []
        logprobs: list[float] = []
        finish = "length"
        with torch.no_grad(), computing(self.model):  # weights cast once, not per token
            x = torch.tensor([list(prompt_ids)], dtype=torch.long)
            past = None
            for _ in range(max_tokens):
                kv = {self._cache_kw: past}
                with computing(self.model):
                    res = self.model(
                        input_ids=x.to(dev),
                        use_cache=True,
                        logits_to_keep=1,
                        **kv,
                    )
                past = getattr(res, self._cache_kw)
                # sampled where the logits are (the model's device); the uniform comes from
                # the CPU generator, so a seeded turn's tokens do not depend on the device
                logits_V = res.logits[0, -1].float()
                logp_V = torch.log_softmax(logits_V / self.temperature, dim=-1)
                tok_1 = draw(logp_V[None], torch.rand(1, generator=gen).to(logp_V.device))
                pair = torch.stack([tok_1[0].double(), logp_V[tok_1[0]].double()]).tolist()
                tok = int(pair[0])  # the step's one host sync: the token and its log-prob
                out.append(tok)
                logprobs.append(pair[1])
                if tok in stops:
                    finish = "stop"
                    break
                x = tok_1[None]
        return SampleResult(out, logprobs, finish, self.policy_version)


ScriptFn = Callable[[SampleRequest], Sequence[int]]


class ScriptedSampler:
    """Returns scripted turns instead of sampling: tests, baselines and replay.

    `script` is either a list of turns (token id lists) served in order to whoever asks, or a
    function of the request (so concurrent episodes can each follow their own script, keyed
    by `request.episode_id` and `request.turn`). Each turn is cut at the first stop token or
    at `max_tokens`, as a real sampler would. `logprobs`, when given, is a function returning
    the recorded logprobs for a request (replay); otherwise every token gets `logprob`.
    """

    def __init__(
        self,
        script: Sequence[Sequence[int]] | ScriptFn,
        *,
        logprob: float = -1.0,
        logprobs: Callable[[SampleRequest], Sequence[float]] | None = None,
        policy_version: int = 0,
    ) -> None:
        self._turns = None if callable(script) else [list(t) for t in script]
        self._fn = script if callable(script) else None
        self.logprob = logprob
        self._logprobs = logprobs
        self.policy_version = policy_version
        self.calls = 0

    @classmethod
    def from_texts(
        cls,
        renderer: Any,
        script: Sequence[str] | Callable[[SampleRequest], str],
        **kwargs: Any,
    ) -> ScriptedSampler:
        """Script turns as text: each is tokenized (as content: text never forms control
        tokens) and closed with the template's turn-end token, as a model would sample it."""
        eos = getattr(renderer.tokenizer, "eos_token_id", None)
        stop = eos if eos in renderer.stop_token_ids else min(renderer.stop_token_ids)

        def encode(text: str) -> list[int]:
            return [*renderer.encode(text, content=True), stop]

        if callable(script):
            fn = script
            return cls(lambda request: encode(fn(request)), **kwargs)
        return cls([encode(t) for t in script], **kwargs)

    async def sample(self, request: SampleRequest) -> SampleResult:
        if self._fn is not None:
            turn = list(self._fn(request))
        else:
            assert self._turns is not None
            if self.calls >= len(self._turns):
                raise IndexError(f"scripted sampler has only {len(self._turns)} turns")
            turn = self._turns[self.calls]
        self.calls += 1
        ids: list[int] = []
        finish = "length"
        for t in turn[: request.max_tokens]:
            ids.append(t)
            if t in request.stop_token_ids:
                finish = "stop"
                break
        lps = list(self._logprobs(request))[: len(ids)] if self._logprobs else None
        if lps is None or len(lps) != len(ids):
            lps = [self.logprob] * len(ids)
        return SampleResult(ids, lps, finish, self.policy_version)
