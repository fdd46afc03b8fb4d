"""A Hugging Face sampler that serves concurrent episodes with one batched forward per step.

Many episodes await `sample(request)` at once; a single worker coroutine collects the requests
that are waiting (those issued in the same few event-loop ticks, at most `max_batch_size`),
and runs one batched generation for them in a worker thread, so the event loop and the
environments keep running meanwhile (the queue and its worker: `tracerl.rollout.batch_queue`).
Sixteen waiting episodes cost one prefill plus one forward per decode step, not sixteen of
each.

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

Sampling happens on the model's device: the log-softmax, the draw (from a uniform drawn on
the CPU from the row's own generator, so a seeded row's tokens do not depend on the device)
and each token's log-prob stay where the logits are, and a decode step reads back only its
tokens and their log-probs, in one transfer (one host sync per step on a GPU).

Continuous batching: a row that stops leaves the batch at once and its caller gets its turn
then, not when the batch drains; a request that arrives while a batch decodes (the next turn
of an episode whose tool answered, another episode's first turn) joins it at the next step,
while the batch has fewer than `max_batch_size` rows: its prompt is prefilled, then it and
the running rows are left-padded to one length (padding keys and values masked out, every row
at its own positions) and decode on together. A learner update waiting for the weights
(`WeightsLock.waiting`) stops new rows joining, so the batch drains and the update goes next.
A batch whose rows have all ended is over: what arrives after that waits for the queue to
gather it (`BatchQueue`: a few event-loop ticks), so turns issued together (a GRPO step's
episodes) start one batch and share their prompts' prefills, not a batch each as they trickle
in (a step of learn-arithmetic's 2-token turns ran twice the forwards before this).
A cache other than transformers' plain growing one (sliding windows, quantized) keeps static
batching.

Key/value memory (`tracerl.rollout.decode_batch`): ``kv_cache="dynamic"`` (the default) holds
the running rows in transformers' growing cache; ``"static"`` in `max_batch_size` slots of a
`StaticCache` allocated once and reused, every decode step the same shapes (a finished row's
slot goes to the next turn that joins); with ``compile=True`` that step is ``torch.compile``'d
(CUDA graphs on a GPU), and under ``bf16-mixed`` it reads bf16 copies of the matmul weights
refreshed at every batch (`tracerl.models.cast_weights`).

Prefix caching (`tracerl.rollout.prefix_cache`, ``prefix_cache_gb``, dynamic cache only): a
finished row's keys and values are kept under its episode, and the episode's next turn
prefills only what follows the longest common prefix of those tokens and its new prompt (its
kept positions right-aligned in the cache, its new tokens right-aligned after them, the gaps
masked); emptied when the weights change, dropped when the episode ends (`end_episode`).

Simplifications: one event loop at a time (the worker is restarted on whichever loop calls
next). If a batch fails, its requests not yet answered are retried one by one, so one bad
request does not fail its batch-mates; if the worker itself fails, every waiting caller
gets the error.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from tracerl.models.cast_weights import CastWeights, castable
from tracerl.rollout.batch_queue import BatchQueue
from tracerl.rollout.decode_batch import GrowingBatch, SlotBatch, StaticSlots, slot_length
from tracerl.rollout.prefix_cache import Kept, PrefixStore, kept_cache, store_bytes
from tracerl.rollout.sampler import SampleRequest, SampleResult, _cache_keyword, draw

log = logging.getLogger(__name__)


@dataclass
class BatchStats:
    """Counters that show whether batching happens."""

    batches: int = 0
    requests: int = 0
    forward_calls: int = 0
    max_batch: int = 0
    shared_prefills: int = 0
    """Requests whose prompt another request in the batch had: prefilled once, shared."""
    admitted: int = 0
    """Requests that joined a batch already decoding (continuous batching)."""


class WeightsLock:
    """The lock a batch holds on the weights while it samples (`reading`), and the learner's
    update or a weight sync while it changes them (``with lock:``), counting who waits for
    it: a batch stops taking in new turns while an update waits, so continuous batching
    never starves the learner. `writes` counts the times it was held to change the weights
    (kept keys and values of an older count are stale: `tracerl.rollout.prefix_cache`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = threading.Lock()
        self.waiting = 0
        self.writes = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        with self._count:
            self.waiting += 1
        try:
            return self._lock.acquire(blocking, timeout)
        finally:
            with self._count:
                self.waiting -= 1

    def release(self) -> None:
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    def __enter__(self) -> WeightsLock:
        self.acquire()
        self.writes += 1  # held to change the weights (or by someone this lock cannot tell)
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """Held by a batch that only reads the weights."""
        self.acquire()
        try:
            yield
        finally:
            self.release()


def _default_pad(model: Any) -> int:
    cfg = model.config
    for pad in (getattr(cfg, "pad_token_id", None), getattr(cfg, "eos_token_id", None)):
        if isinstance(pad, list | tuple):
            pad = pad[0] if pad else None
        if pad is not None:
            return int(pad)
    return 0


class BatchedHFSampler(BatchQueue):
    """Ancestral sampling from a causal LM, batching the requests that wait together (the
    queue, its worker and who owns a failure: `tracerl.rollout.batch_queue`)."""

    def __init__(
        self,
        model: Any,
        *,
        temperature: float = 1.0,
        seed: int = 0,
        policy_version: int = 0,
        max_batch_size: int = 16,
        pad_token_id: int | None = None,
        kv_cache: str = "dynamic",
        compile: bool = False,
        prefix_cache_gb: float | str = "auto",
    ) -> None:
        import torch

        from tracerl.models.placement import device_of

        if temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0: greedy), got {temperature}")
        super().__init__(max_batch_size)
        if kv_cache not in ("dynamic", "static"):
            raise ValueError(f"kv_cache must be 'dynamic' or 'static', got {kv_cache!r}")
        if compile and kv_cache != "static":
            raise ValueError(
                "compile=True needs kv_cache='static' (a compiled decode step needs shapes "
                "that never change); set model.kv_cache: static"
            )
        if kv_cache == "static" and (why := StaticSlots.supported(model)):
            log.warning(
                "model.kv_cache: static is not possible for this model: %s; decoding from "
                "a dynamic cache",
                why,
            )
            kv_cache, compile = "dynamic", False
        if compile and (why := StaticSlots.compile_unsafe(device_of(model))):
            log.warning("model.compile is off: %s; decoding from static slots eagerly", why)
            compile = False
        self.model = model
        self.temperature = temperature
        self.policy_version = policy_version
        self.pad_token_id = _default_pad(model) if pad_token_id is None else pad_token_id
        self.generator = torch.Generator().manual_seed(seed)
        self.kv_cache = kv_cache
        self.compile = compile
        # compiled under bf16-mixed: decode through bf16 copies of the matmul weights
        # (refreshed every batch), not casts captured into every replayed step
        self._casts = CastWeights(model) if compile and castable(model) else None
        # static slots (their key/value memory), shared with `with_temperature`'s sampler
        self._slot_store: dict[str, StaticSlots] = {}
        self.stats = BatchStats()
        self._cache_kw = _cache_keyword(model)
        self._model_lock = WeightsLock()
        # each finished turn's keys and values, for its episode's next turn (dynamic cache)
        self.prefix_cache_gb = prefix_cache_gb
        self.prefixes = PrefixStore(store_bytes(prefix_cache_gb, device_of(model)))
        self._weights_now: tuple[int, int] = (policy_version, 0)

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
            kv_cache=self.kv_cache,
            compile=self.compile,
            prefix_cache_gb=self.prefix_cache_gb,  # a store of its own: its version is its own
        )
        other._model_lock = self._model_lock
        other._slot_store = self._slot_store  # the lock keeps their batches apart
        other._casts = self._casts
        other.gather_s = self.gather_s
        other.continuous = self.continuous
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
        with self._model_lock.reading(), torch.no_grad():
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

    def generate_batch(
        self, requests: Sequence[SampleRequest], *, policy_version: int | None = None
    ) -> list[SampleResult]:
        """Sample every request's turn together (synchronous; one forward per decode step)."""
        return self._decode(list(requests), policy_version=policy_version)

    def _decode(
        self,
        requests: list[SampleRequest],
        *,
        policy_version: int | None = None,
        admit: Any = None,
        deliver: Any = None,
    ) -> list[SampleResult]:
        """Prefill `requests`, then decode one token per running row per step until every
        row has stopped. After each step, `admit(room, fits)` may hand over newly arrived
        requests: they are prefilled and join the running batch (continuous batching) while
        it has fewer than `max_batch_size` rows, nobody waits for the weights (an update
        waiting for the lock ends admission: the batch drains) and the cache can take them;
        once every row has ended, the batch is over (nothing is asked for then);
        `deliver(i, result)` gets each request's result as its row ends. Results in the
        order the requests were served."""
        import torch

        from tracerl.models.placement import computing, device_of

        dev = device_of(self.model)  # where every step's logits, draws and log-probs live
        served = list(requests)
        gens: list[Any] = []
        tokens: list[list[int]] = []
        logprobs: list[list[float]] = []
        results: list[SampleResult | None] = []

        def enrol(new: Sequence[SampleRequest]) -> None:
            for r in new:
                gens.append(
                    self.generator if r.seed is None else torch.Generator().manual_seed(r.seed)
                )
                tokens.append([])
                logprobs.append([])
                results.append(None)
            self.stats.requests += len(new)

        # one autocast region for the whole batch (under bf16-mixed): fp32 weights are cast
        # to bf16 once and the cast reused by every decode step, not cast again per token
        with self._model_lock.reading(), torch.no_grad(), computing(self.model):
            # read under the lock the learner's step takes: the version of these weights
            version = self.policy_version if policy_version is None else policy_version
            self._weights_now = (version, self._model_lock.writes)
            if self._casts is not None:
                self._casts.refresh()  # the weights as they are now (an update may have run)
            self.stats.batches += 1
            enrol(served)
            rows = list(range(len(served)))  # the requests still in the batch, in batch order
            batch = (SlotBatch if self.kv_cache == "static" else GrowingBatch)(self, dev)
            logits_B_V = batch.start(served)
            self.stats.max_batch = max(self.stats.max_batch, len(rows))
            while rows:
                next_B, lp_B = self._pick(logits_B_V, [gens[b] for b in rows])
                # the step's one host sync: its tokens and their log-probs, together
                picked = torch.stack([next_B.double(), lp_B.double()]).tolist()
                keep = []
                for i, b in enumerate(rows):
                    tok = int(picked[0][i])
                    tokens[b].append(tok)
                    logprobs[b].append(picked[1][i])
                    stop = tok in served[b].stop_token_ids
                    if stop or len(tokens[b]) >= served[b].max_tokens:
                        out = SampleResult(
                            tokens[b], logprobs[b], "stop" if stop else "length", version
                        )
                        results[b] = out
                        self._keep_prefix(batch, i, served[b], tokens[b])
                        if deliver is not None:  # its caller goes on now, not with the batch
                            deliver(b, out)
                    else:
                        keep.append(i)
                if keep:
                    if len(keep) < len(rows):  # finished rows leave the batch and the cache
                        index = torch.tensor(keep, device=dev)
                        batch.keep(keep, index)
                        rows = [rows[i] for i in keep]
                        next_B = next_B[index]
                    logits_B_V = batch.step(next_B)
                else:
                    break  # drained: the queue forms the next batch of what waits by then
                room = self.max_batch_size - len(rows)
                if admit is None or room <= 0 or self._model_lock.waiting:
                    continue  # an update waiting for the weights: the batch drains
                joining = admit(room, batch.fits)
                if joining:
                    first = len(served)
                    served.extend(joining)
                    enrol(joining)
                    self.stats.admitted += len(joining)
                    logits_B_V = batch.join(joining, logits_B_V)
                    rows += range(first, len(served))
                    self.stats.max_batch = max(self.stats.max_batch, len(rows))
        assert all(r is not None for r in results)
        return results  # type: ignore[return-value]

    def _prefill(self, requests: Sequence[SampleRequest], dev: Any) -> tuple[Any, Any, Any, Any]:
        """One forward over `requests`' prompts, left-padded: each row's next-token logits,
        the KV cache, the attention mask and each row's next position (its prompt's length),
        all on `dev` (a decode step then copies nothing to the device but its own token).
        Identical prompts (a GRPO group's members; their turns after identical tool results)
        are prefilled once and their cache rows repeated."""
        import torch

        slot: dict[tuple[int, ...], int] = {}
        which = [slot.setdefault(tuple(r.prompt_ids), len(slot)) for r in requests]
        prompts = list(slot)
        kept: list[Kept | None] = [None] * len(prompts)
        if self.prefixes.max_bytes and self.kv_cache == "dynamic":  # static slots: no gaps
            episodes = [r.episode_id for r in requests]
            kept = self.prefixes.take_for(episodes, which, prompts, self._weights_now)
        if any(kept):
            logits_U_V, cache, mask_U_T = self._prefill_after(prompts, kept, dev)
        else:
            ids_U_T, mask_U_T = self._left_pad(prompts)
            mask_U_T = mask_U_T.to(dev)
            pos_U_T = (mask_U_T.cumsum(-1) - 1).clamp(min=0)
            logits_U_V, cache = self._forward(ids_U_T, mask_U_T, pos_U_T, None, dev)
        which_B = torch.tensor(which, device=dev)
        if len(slot) < len(requests):
            cache.batch_select_indices(which_B)
            self.stats.shared_prefills += len(requests) - len(slot)
        mask_B_T = mask_U_T[which_B]
        return logits_U_V[which_B], cache, mask_B_T, mask_B_T.sum(-1)

    def _prefill_after(
        self, prompts: list[tuple[int, ...]], kept: list[Kept | None], dev: Any
    ) -> tuple[Any, Any, Any]:
        """Prefill `prompts` where some start from kept keys and values (`kept_cache`: row
        u's kept n positions right-aligned in a cache of the longest kept length C), feeding
        only each row's remaining tokens, left-padded (`_left_pad`) after them at positions
        n, n+1, ... So each row's mask over the C + S columns is [0.. | 1 x n | 0.. | 1 x
        rest]: every real token sees exactly its own prefix. The rows' last logits, the
        cache and the mask."""
        import torch

        n_U = torch.tensor([got[0] if got is not None else 0 for got in kept])
        ids_U_S, rest_U_S = self._left_pad(
            [p[n:] for p, n in zip(prompts, n_U.tolist(), strict=True)]
        )
        pos_U_S = (n_U[:, None] + rest_U_S.cumsum(-1) - 1) * rest_U_S  # pads: 0
        cache, kept_U_C = kept_cache(self.model.config, kept)
        mask_U_W = torch.cat([kept_U_C, rest_U_S], dim=1).to(dev)
        logits_U_V, cache = self._forward(ids_U_S, mask_U_W, pos_U_S, cache, dev)
        return logits_U_V, cache, mask_U_W

    def end_episode(self, episode_id: str) -> None:
        """`episode_id` will ask for no more turns: its kept keys and values go now."""
        self.prefixes.forget(episode_id)

    def _keep_prefix(self, batch: Any, i: int, request: SampleRequest, tokens: list[int]) -> None:
        """Keep row `i`'s keys and values (its prompt and its sampled tokens but the last,
        never fed) for its episode's next turn (`tracerl.rollout.prefix_cache`); nothing
        of a turn no other can follow (`SampleRequest.last`)."""
        if not self.prefixes.max_bytes or request.episode_id is None or request.last:
            return
        layers = batch.row_cache(i)
        if layers is None:
            return
        seq = (*request.prompt_ids, *tokens[:-1])
        if layers[0][0].shape[1] != len(seq):  # never expected: keep nothing rather than lie
            log.warning(
                "prefix cache: row holds %d positions for %d tokens; not kept",
                layers[0][0].shape[1],
                len(seq),
            )
            return
        self.prefixes.put(request.episode_id, seq, layers, self._weights_now)

    def _pick(self, logits_B_V: Any, gens: Sequence[Any]) -> tuple[Any, Any]:
        """Each row's next token and its log-prob, computed where the logits are (the model's
        device): ``log_softmax(logits / temperature)``, then the token drawn by `draw` from a
        uniform of the row's own generator (drawn on the CPU, as always: a seeded request's
        tokens are the same whatever the device and its batch-mates), or the argmax at
        temperature 0 (greedy: `tracerl serve` for a judge, greedy evaluations)."""
        import torch

        logp_B_V = torch.log_softmax(logits_B_V.float() / (self.temperature or 1.0), -1)
        if not self.temperature:
            next_B = logp_B_V.argmax(-1)
        else:
            uniforms_B = torch.cat([torch.rand(1, generator=g) for g in gens])
            next_B = draw(logp_B_V, uniforms_B.to(logp_B_V.device))
        return next_B, logp_B_V.gather(1, next_B[:, None])[:, 0]

    @property
    def _decoder(self) -> Any:
        """The module a forward runs: the model, or under ``compile`` with ``bf16-mixed``
        its view with bf16 copies of the matmul weights (`CastWeights`: the same numbers)."""
        return self.model if self._casts is None else self._casts.view

    def reserve(self, rows: int, positions: int) -> None:
        """With ``kv_cache="static"``: allocate slots for `rows` rows of `positions`
        positions (prompt + new tokens) now, so that the batches that fit them (every
        batch, when these are the largest) reuse them and the decode step compiled for them
        (``compile``) is compiled once, not when a batch first needs more. Nothing with the
        dynamic cache."""
        if self.kv_cache == "static":
            from tracerl.models.placement import device_of

            with self._model_lock.reading():  # never while a batch decodes from the slots
                self._static_slots(positions, rows, device_of(self.model))

    def _static_slots(self, need: int, rows: int, dev: Any) -> StaticSlots:
        """Static slots for a batch of `rows` rows that needs `need` positions: the ones
        already allocated when they are large enough (their addresses, and so a captured
        step, stay), else new ones (the old freed first)."""
        batch = max(self.max_batch_size, rows)
        slots = self._slot_store.get("slots")
        if slots is None or slots.batch < batch or slots.length < need or slots.dev != dev:
            self._slot_store.pop("slots", None)
            length = slot_length(need)
            slots = StaticSlots(self.model, batch, length, dev, self.pad_token_id)
            self._slot_store["slots"] = slots
        return slots

    def _slot_forward(self, ids_S: Any, mask_S_L: Any, pos_S: Any, cache: Any, written: int) -> Any:
        """A decode step over every static slot: each slot's logits (fp32, on the device).
        With `compile`, the model's ``torch.compile``'d call (transformers'
        ``get_compiled_call``: ``mode="reduce-overhead"``, CUDA graphs on a GPU); if
        compiling fails, a warning, and this sampler decodes eagerly from then on."""
        from tracerl.models.placement import computing

        self.stats.forward_calls += 1
        inputs = {
            "input_ids": ids_S,
            "attention_mask": mask_S_L,
            "position_ids": pos_S,
            "use_cache": True,
            "logits_to_keep": 1,
            self._cache_kw: cache,
        }
        with computing(self.model):
            if not self.compile:
                res = self._decoder(**inputs)
            else:
                try:
                    res = self._compiled_call()(**inputs)
                except Exception as exc:
                    log.warning(
                        "the compiled decode step failed (%s: %s); decoding eagerly",
                        type(exc).__name__,
                        exc,
                    )
                    self.compile = False
                    for layer in cache.layers:  # undo a write the failed step may have counted
                        layer.cumulative_length.fill_(written)
                    res = self._decoder(**inputs)
        # a copy: a replayed CUDA graph writes its next logits where these are
        return res.logits[:, -1].float().clone()

    def _compiled_call(self) -> Any:
        """The model's compiled call for decode steps (one per model, shared by every
        sampler of it): transformers' own when the model has one, else ``torch.compile``."""
        model = self._decoder
        if hasattr(model, "get_compiled_call"):
            from transformers import CompileConfig

            return model.get_compiled_call(CompileConfig(fullgraph=False, dynamic=False))
        compiled = getattr(model, "_tracerl_compiled_call", None)
        if compiled is None:
            import torch

            compiled = torch.compile(model, mode="reduce-overhead", dynamic=False)
            model._tracerl_compiled_call = compiled
        return compiled

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
        (fp32, left on `dev`: sampling happens there), and the grown KV cache."""
        from tracerl.models.placement import computing

        self.stats.forward_calls += 1
        with computing(self.model):  # its precision (bf16 autocast under bf16-mixed)
            res = self._decoder(
                input_ids=ids_B_T.to(dev),
                attention_mask=mask_B_T.to(dev),
                position_ids=pos_B_T.to(dev),
                use_cache=True,
                logits_to_keep=1,
                **{self._cache_kw: cache},
            )
        return res.logits[:, -1].float(), getattr(res, self._cache_kw)
