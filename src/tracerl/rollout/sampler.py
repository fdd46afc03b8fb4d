"""Samplers: token ids in, sampled token ids + per-token logprobs + finish reason out.

Logprob definition: for each sampled token, ``log softmax(logits / temperature)[token]`` —
the log-probability under the distribution the token was actually drawn from (temperature
applied, no top-k/top-p truncation). A learner that recomputes logprobs at temperature 1.0
must apply the same temperature to compare them.

This module holds the plain, one-sequence-at-a-time Hugging Face sampler and a scripted
sampler for tests. Batching across concurrent episodes is the rollout engine's job.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class SampleResult:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (a stop token was sampled, and is included) or "length"
    policy_version: int


class Sampler(Protocol):
    policy_version: int

    def sample(
        self, prompt_ids: Sequence[int], *, max_tokens: int, stop_token_ids: Iterable[int]
    ) -> SampleResult: ...


class HFSampler:
    """Ancestral sampling from a causal LM with a KV cache, one sequence at a time."""

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
        # transformers >= 5.2x names the KV cache `cache`; older releases `past_key_values`.
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    def sample(
        self, prompt_ids: Sequence[int], *, max_tokens: int, stop_token_ids: Iterable[int]
    ) -> SampleResult:
        import torch

        stops = set(stop_token_ids)
        out: list[int] = []
        logprobs: list[float] = []
        finish = "length"
        with torch.no_grad():
            x = torch.tensor([list(prompt_ids)], dtype=torch.long)
            past = None
            for _ in range(max_tokens):
                kv = {self._cache_kw: past}
                res = self.model(input_ids=x, use_cache=True, logits_to_keep=1, **kv)
                past = getattr(res, self._cache_kw)
                logp_V = torch.log_softmax(res.logits[0, -1].float() / self.temperature, dim=-1)
                tok = int(torch.multinomial(logp_V.exp(), 1, generator=self.generator))
                out.append(tok)
                logprobs.append(float(logp_V[tok]))
                if tok in stops:
                    finish = "stop"
                    break
                x = torch.tensor([[tok]], dtype=torch.long)
        return SampleResult(out, logprobs, finish, self.policy_version)


class ScriptedSampler:
    """Replays fixed turns (token ids, optional logprobs) in order: tests and baselines."""

    def __init__(self, turns: Sequence[Sequence[int]], *, logprob: float = -1.0) -> None:
        self.turns = [list(t) for t in turns]
        self.logprob = logprob
        self.policy_version = 0
        self.calls = 0

    def sample(
        self, prompt_ids: Sequence[int], *, max_tokens: int, stop_token_ids: Iterable[int]
    ) -> SampleResult:
        if self.calls >= len(self.turns):
            raise IndexError(f"scripted sampler has only {len(self.turns)} turns")
        turn = self.turns[self.calls]
        self.calls += 1
        stops = set(stop_token_ids)
        ids: list[int] = []
        for t in turn[:max_tokens]:
            ids.append(t)
            if t in stops:
                return SampleResult(ids, [self.logprob] * len(ids), "stop", 0)
        return SampleResult(ids, [self.logprob] * len(ids), "length", 0)
