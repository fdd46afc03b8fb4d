"""A Hugging Face sampler that serves concurrent episodes with one batched forward per step.

Many episodes await `sample(request)` at once; a single worker coroutine collects the requests
that are waiting (those issued in the same few event-loop ticks, at most `max_batch_size`),
and runs one batched generation for them in a worker thread, so the event loop and the
environments keep running meanwhile. Sixteen waiting episodes cost one prefill plus one
forward per decode step, not sixteen of each.

Logprob definition (the same as `tracerl.rollout.sampler`): for each sampled token,
``log softmax(logits / temperature)[token]``, temperature applied, no top-k/top-p truncation.
Temperature 0 is greedy decoding (the most likely token; its log-prob untempered): for
`tracerl serve` answering a model judge and for greedy evaluations (``eval.temperature: 0``,
`with_temperature`), never for training (the config refuses it).

Padding: prompts are left-padded to the longest one, with an attention mask that hides the
pad tokens and explicit ``position_ids = clamp(cumsum(mask) - 1, min=0)``, so each row's real
tokens sit at positions 0..len-1 exactly as they would unpadded, and the last column holds
every row's next-token logits (prefill uses ``logits_to_keep=1``). Each decode step feeds one
token per row at position ``len + step``, with the mask grown by one column, reusing the
KV cache. A row stops recording at a stop token (included) or at its own `max_tokens`; the
loop ends when every row has.

Randomness: a request with a `seed` draws from its own ``torch.Generator``, so its tokens do
not depend on its batch-mates (up to floating-point noise of batched kernels); requests
without one share the sampler's generator.

Simplifications: static batching (a request that arrives while a batch runs waits for the
next batch), no prefix caching across turns (each turn re-prefills its whole prompt), and
one event loop at a time (the worker is restarted on whichever loop calls next). If a batch
fails, its requests are retried one by one, so one bad request does not fail its batch-mates.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tracerl.rollout.sampler import SampleRequest, SampleResult, _cache_keyword, draw

Pending = tuple[SampleRequest, "asyncio.Future[SampleResult]"]


@dataclass
class BatchStats:
    """Counters that show whether batching happens."""

    batches: int = 0
    requests: int = 0
    forward_calls: int = 0
    max_batch: int = 0
    shared_prefills: int = 0
    """Requests whose prompt another request in the batch had: prefilled once, shared."""


def _default_pad(model: Any) -> int:
    cfg = model.config
    for pad in (getattr(cfg, "pad_token_id", None), getattr(cfg, "eos_token_id", None)):
        if isinstance(pad, list | tuple):
            pad = pad[0] if pad else None
        if pad is not None:
            return int(pad)
    return 0


class BatchedHFSampler:
    """Ancestral sampling from a causal LM, batching the requests that wait together."""

    gather_ticks = 4  # event-loop ticks to wait so requests issued together share a batch
    gather_s = 0.0
    """Seconds to wait for more requests after one arrives (see `_gather_stragglers`); 0:
    only `gather_ticks` (requests of in-process episodes arrive in the same ticks)."""

    def __init__(
        self,
        model: Any,
        *,
        temperature: float = 1.0,
        seed: int = 0,
        policy_version: int = 0,
        max_batch_size: int = 16,
        pad_token_id: int | None = None,
    ) -> None:
        import torch

        if temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0: greedy), got {temperature}")
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.model = model
        self.temperature = temperature
        self.policy_version = policy_version
        self.max_batch_size = max_batch_size
        self.pad_token_id = _default_pad(model) if pad_token_id is None else pad_token_id
        self.generator = torch.Generator().manual_seed(seed)
        self.stats = BatchStats()
        self._cache_kw = _cache_keyword(model)
        self._model_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._worker: asyncio.Task[None] | None = None
        self._wakeup: asyncio.Event | None = None
        self._pending: list[Pending] = []

    def with_temperature(self, temperature: float, seed: int) -> BatchedHFSampler:
        """A second sampler over the same weights (and the same lock: an update waits for
        its batches) at `temperature` (0: greedy), from `seed`: an evaluation's, while this
        one keeps sampling training episodes at its own."""
        other = BatchedHFSampler(
            self.model,
            temperature=temperature,
            seed=seed,
            policy_version=self.policy_version,
            max_batch_size=self.max_batch_size,
            pad_token_id=self.pad_token_id,
        )
        other._model_lock = self._model_lock
        other.gather_s = self.gather_s
        return other

    def prompt_logprobs(
        self, ids: list[int], top: int = 0, chunk: int = 256
    ) -> list[dict[int, tuple[float, int]] | None]:
        """Each position's log-prob of the token there given those before it, at this
        sampler's temperature (1 when it is greedy), with its rank, and the `top` most
        likely tokens' (what a teacher scores a student's tokens with: vLLM's
        ``prompt_logprobs``). Position 0 has none. One forward pass, under the weights'
        lock; the log-softmax runs `chunk` positions at a time."""
        import torch

        from tracerl.models.placement import computing, device_of

        temperature = self.temperature or 1.0
        out: list[dict[int, tuple[float, int]] | None] = [None]
        with self._model_lock, torch.no_grad():
            x = torch.tensor([ids], device=device_of(self.model))
            with computing(self.model):
                logits_T_V = self.model(input_ids=x).logits[0, :-1]
            for start in range(0, logits_T_V.shape[0], chunk):
                lp_C_V = torch.log_softmax(
                    logits_T_V[start : start + chunk].float() / temperature, -1
                )
                target_C = torch.tensor(ids[start + 1 : start + 1 + lp_C_V.shape[0]])
                chosen_C = lp_C_V.gather(1, target_C[:, None].to(lp_C_V.device))[:, 0]
                rank_C = (lp_C_V > chosen_C[:, None]).sum(-1) + 1
                best = torch.topk(lp_C_V, top, dim=-1) if top else None
                for c in range(lp_C_V.shape[0]):
                    entry = {int(target_C[c]): (float(chosen_C[c]), int(rank_C[c]))}
                    if best is not None:
                        for r, (v, t) in enumerate(
                            zip(best.values[c], best.indices[c], strict=True)
                        ):
                            entry.setdefault(int(t), (float(v), r + 1))
                    out.append(entry)
        return out

    async def sample(self, request: SampleRequest) -> SampleResult:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._worker is None or self._worker.done():
            self._start_worker(loop)
        assert self._wakeup is not None
        fut: asyncio.Future[SampleResult] = loop.create_future()
        self._pending.append((request, fut))
        self._wakeup.set()
        return await fut

    def _start_worker(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._loop is not loop:  # futures of a previous (finished) loop have no waiters
            self._pending = []
        self._loop = loop
        self._wakeup = asyncio.Event()
        self._worker = loop.create_task(self._run(self._wakeup), name="BatchedHFSampler")

    async def _run(self, wakeup: asyncio.Event) -> None:
        while True:
            if not self._pending:
                wakeup.clear()
                await wakeup.wait()
                continue
            for _ in range(self.gather_ticks):
                await asyncio.sleep(0)
            await self._gather_stragglers()
            taken = self._pending[: self.max_batch_size]
            del self._pending[: self.max_batch_size]
            batch = [(req, fut) for req, fut in taken if not fut.done()]
            if batch:
                await self._serve(batch)

    async def _gather_stragglers(self) -> None:
        """With `gather_s` > 0: wait while requests keep arriving (each wait `gather_s`,
        all of them at most 10 x `gather_s`), so turns that arrive milliseconds apart
        (over HTTP, from many threads: the gateway's agents) share one batch."""
        if self.gather_s <= 0:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10 * self.gather_s
        seen = len(self._pending)
        while seen < self.max_batch_size and loop.time() < deadline:
            await asyncio.sleep(self.gather_s)
            if len(self._pending) == seen:
                return
            seen = len(self._pending)

    async def _serve(self, batch: list[Pending]) -> None:
        requests = [req for req, _ in batch]
        outcomes: list[SampleResult | Exception]
        try:
            outcomes = await asyncio.to_thread(self._generate_isolated, requests)
        except asyncio.CancelledError:
            for _, fut in batch:
                fut.cancel()
            raise
        except Exception as exc:  # never leave a caller waiting
            outcomes = [exc] * len(batch)
        for (_, fut), out in zip(batch, outcomes, strict=True):
            if fut.done():  # the caller gave up (cancelled)
                continue
            if isinstance(out, Exception):
                fut.set_exception(out)
            else:
                fut.set_result(out)

    def _generate_isolated(self, requests: list[SampleRequest]) -> list[SampleResult | Exception]:
        """The batch's results; if it fails, each request alone, failures as exceptions."""
        try:
            return list(self.generate_batch(requests))
        except Exception as exc:
            if len(requests) == 1:
                return [exc]
        outcomes: list[SampleResult | Exception] = []
        for req in requests:
            try:
                outcomes.extend(self.generate_batch([req]))
            except Exception as exc:
                outcomes.append(exc)
        return outcomes

    def generate_batch(
        self, requests: Sequence[SampleRequest], *, policy_version: int | None = None
    ) -> list[SampleResult]:
        """Sample every request's turn together (synchronous; one forward per decode step)."""
        import torch

        from tracerl.models.placement import device_of

        dev = device_of(self.model)  # where every step's inputs go (sampling stays on the CPU)
        gens = [
            self.generator if r.seed is None else torch.Generator().manual_seed(r.seed)
            for r in requests
        ]
        n_B = len(requests)
        tokens: list[list[int]] = [[] for _ in requests]
        logprobs: list[list[float]] = [[] for _ in requests]
        finish = ["length"] * n_B
        done = [False] * n_B
        with self._model_lock, torch.no_grad():
            # read under the lock the learner's step takes: the version of these weights
            version = self.policy_version if policy_version is None else policy_version
            self.stats.batches += 1
            self.stats.requests += n_B
            self.stats.max_batch = max(self.stats.max_batch, n_B)
            # identical prompts (a GRPO group's members; their turns after identical tool
            # results) are prefilled once, and their KV cache rows repeated
            slot: dict[tuple[int, ...], int] = {}
            which = [slot.setdefault(tuple(r.prompt_ids), len(slot)) for r in requests]
            ids_U_T, mask_U_T = self._left_pad(list(slot))
            pos_U_T = (mask_U_T.cumsum(-1) - 1).clamp(min=0)
            logits_U_V, cache = self._forward(ids_U_T, mask_U_T, pos_U_T, None, dev)
            which_B = torch.tensor(which)
            if len(slot) < n_B:
                cache.batch_select_indices(which_B.to(dev))
                self.stats.shared_prefills += n_B - len(slot)
            logits_B_V, mask_B_T = logits_U_V[which_B], mask_U_T[which_B]
            len_B = mask_B_T.sum(-1)
            rows = list(range(n_B))  # the requests still in the batch, in batch order
            for step in range(max(r.max_tokens for r in requests)):
                logp_B_V = torch.log_softmax(logits_B_V.float() / (self.temperature or 1.0), -1)
                uniforms_B = torch.cat([torch.rand(1, generator=gens[b]) for b in rows])
                # temperature 0 is greedy (`tracerl serve` for a judge; training refuses it)
                next_B = logp_B_V.argmax(-1) if not self.temperature else draw(logp_B_V, uniforms_B)
                for i, b in enumerate(rows):
                    tok = int(next_B[i])
                    tokens[b].append(tok)
                    logprobs[b].append(float(logp_B_V[i, tok]))
                    if tok in requests[b].stop_token_ids:
                        finish[b], done[b] = "stop", True
                    elif len(tokens[b]) >= requests[b].max_tokens:
                        done[b] = True
                if all(done):
                    break
                keep = [i for i, b in enumerate(rows) if not done[b]]
                if len(keep) < len(rows):  # finished rows leave the batch (and the KV cache)
                    index = torch.tensor(keep)
                    cache.batch_select_indices(index.to(dev))
                    rows = [rows[i] for i in keep]
                    next_B, mask_B_T, len_B = next_B[index], mask_B_T[index], len_B[index]
                mask_B_T = torch.cat([mask_B_T, mask_B_T.new_ones(len(rows), 1)], dim=-1)
                pos_B_1 = (len_B + step)[:, None]
                logits_B_V, cache = self._forward(next_B[:, None], mask_B_T, pos_B_1, cache, dev)
        return [
            SampleResult(t, lp, f, version)
            for t, lp, f in zip(tokens, logprobs, finish, strict=True)
        ]

    def _left_pad(self, prompts: Sequence[Sequence[int]]) -> tuple[Any, Any]:
        import torch

        width = max(len(p) for p in prompts)
        ids_B_T = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        mask_B_T = torch.zeros((len(prompts), width), dtype=torch.long)
        for b, p in enumerate(prompts):
            ids_B_T[b, width - len(p) :] = torch.tensor(list(p), dtype=torch.long)
            mask_B_T[b, width - len(p) :] = 1
        return ids_B_T, mask_B_T

    def _forward(
        self, ids_B_T: Any, mask_B_T: Any, pos_B_T: Any, cache: Any, dev: Any
    ) -> tuple[Any, Any]:
        """One forward pass on the model's device `dev`: the last position's logits per row
        (on the CPU), and the grown KV cache."""
        from tracerl.models.placement import computing

        self.stats.forward_calls += 1
        with computing(self.model):  # its precision (bf16 autocast under bf16-mixed)
            res = self.model(
                input_ids=ids_B_T.to(dev),
                attention_mask=mask_B_T.to(dev),
                position_ids=pos_B_T.to(dev),
                use_cache=True,
                logits_to_keep=1,
                **{self._cache_kw: cache},
            )
        return res.logits[:, -1].float().cpu(), getattr(res, self._cache_kw)
