"""The learner: PPO-style updates on trajectories, on the model's device, lean on memory.

One `update` = K epochs over length-bucketed micro-batches with gradient accumulation.
The PPO ratio is taken against the policy before the update: in the first epoch that is
the current model itself (the sampler shares it in-process, so its weights are the ones that
sampled), so the old log-probs are the first epoch's own forward pass, detached — no extra
forward. Later epochs reuse them. Each micro-batch's loss is weighted so that the
accumulated gradient equals the whole step's loss under the configured aggregation (token
share for ``token-mean``, sequence share for the ``seq-mean-*`` modes, one constant length
for ``seq-mean-token-sum-norm``); then gradient clipping and one AdamW step per epoch.

Micro-batches are built on the CPU and moved to the trained weights' device just before their
forward; the forward runs in the model's precision (`tracerl.models.placement`: fp32 on a
CPU, bf16 autocast over fp32 master weights and fp32 AdamW state on a GPU by default).

Options: a KL term against the reference policy (``kl_coef`` > 0; with LoRA the reference
is the same model with its adapters disabled, see `tracerl.train.lora`); `torch.compile` of
the decoder for the learner's forward and backward (the sampler keeps the eager model);
gradient checkpointing of the decoder layers (less activation memory, ~30% more compute).
The caller bumps the sampler's `policy_version` after an update.

Across processes (`tracerl.train.distributed`): every rank builds the same micro-batches and loss
weights from the whole step, runs its share (balanced by padded tokens), and a `Strategy`
sums the gradients (``ddp``) or shards everything (``fsdp2``); the step's loss, gradient
norm and update are the single-process ones. Rank 0 sends each call to the other ranks
first (`channel`, `tracerl.train.distributed.group`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from tracerl.algos.kl import kl as kl_estimate
from tracerl.algos.losses import ClipConfig, PolicyLossInput, aggregate, ppo_clip
from tracerl.models.placement import device_of
from tracerl.train.batch import Batch, bucketed_batches, shared_prefix_batches
from tracerl.train.distributed.strategy import Strategy
from tracerl.train.logprobs import token_logprobs
from tracerl.train.lora import Reference, is_lora
from tracerl.types import Trajectory


@dataclass
class LearnerConfig:
    lr: float = 1e-5
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    epochs: int = 1
    micro_batch_tokens: int = 4096
    temperature: float = 1.0
    """The sampler's temperature: log-probs are of the distribution it sampled from."""
    chunk_tokens: int = 1024
    clip: ClipConfig = field(default_factory=ClipConfig)
    kl_coef: float = 0.0
    """beta of a ``beta * KL(policy || reference)`` loss term; 0 disables it."""
    kl_estimator: str = "k3"
    compile: bool = False
    """`torch.compile` the decoder for the learner (dynamic shapes)."""
    gradient_checkpointing: bool = False
    share_prefix: bool = True
    """Run a group's shared prompt once per micro-batch (`shared_prefix_batches`); off with
    gradient checkpointing or compile (transformers drops the KV cache in checkpointed
    layers; the compiled decoder is traced without one)."""


def _micro_batch_weights(batches: list[Any], agg: str) -> list[float]:
    """Weights that make the accumulated micro-batch losses equal the whole-step loss:
    token share for ``token-mean``, sequence share for the ``seq-mean-*`` modes (the
    ``-norm`` one included: a sequence mean over a constant); shares of the rows' weights
    (`Batch.weights_B`) where they have them."""

    def row_weights(b: Any) -> torch.Tensor:
        ones = torch.ones(b.loss_mask_B_T.shape[0])
        return ones if b.weights_B is None else b.weights_B.float()

    if agg == "token-mean":
        parts = [float((b.loss_mask_B_T.sum(-1) * row_weights(b)).sum()) for b in batches]
    else:
        parts = [float(((b.loss_mask_B_T.sum(-1) > 0) * row_weights(b)).sum()) for b in batches]
    whole = sum(parts)
    return [p / whole if whole > 0 else 0.0 for p in parts]


class Learner:
    def __init__(
        self,
        model: Any,
        config: LearnerConfig | None = None,
        strategy: Strategy | None = None,
        channel: Any = None,
    ) -> None:
        self.model = model
        """The whole model: the sampler's (on rank 0), what checkpoints and weight syncs read."""
        self.cfg = config or LearnerConfig()
        self.strategy = strategy or Strategy()
        self.channel = channel
        """Rank 0 of several: sends each call to the other ranks (`tracerl.train.distributed`)."""
        if self.cfg.compile and self.strategy.name == "fsdp2":
            raise ValueError(
                "trainer.compile is not supported with trainer.learner.strategy=fsdp2 "
                "(the sharded decoder is not compiled here): turn one of them off"
            )
        if channel is not None:
            channel.send("init")
        if self.cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
            # generation must still use the KV cache (checkpointing turns it off)
            model.config.use_cache = True
        self.strategy.synchronize(model)  # every rank starts from rank 0's weights
        # a frozen copy of the full weights, taken before any sharding (each rank keeps one)
        full_reference = self.cfg.kl_coef > 0 and not is_lora(model)
        self.reference = Reference(model) if full_reference else None
        self.trained = self.strategy.prepare(model)
        """The module this rank trains: `model` itself, or (fsdp2) its sharded copy."""
        if self.cfg.kl_coef > 0 and self.reference is None:
            self.reference = Reference(self.trained)  # LoRA: adapters off, no copy
        self._params = params = [p for p in self.trained.parameters() if p.requires_grad]
        # fused: one kernel per parameter, no foreach temporaries the size of the model
        self.optimizer = torch.optim.AdamW(
            params, lr=self.cfg.lr, weight_decay=self.cfg.weight_decay, fused=True
        )
        self._body = None
        if self.cfg.compile:
            self._body = torch.compile(model.get_decoder(), dynamic=True)
        self.updates = 0
        self.shrunk = 0
        """Times an update ran out of device memory and halved its micro-batches."""
        self._stepped = False
        self.weights_lock: Any = contextlib.nullcontext()
        self.progress: Any = None
        """A `tracerl.report.progress` object: an update shows its micro-batches on it."""
        """Held while the optimizer writes the weights: an in-process sampler that shares
        them (async training) holds it for each generation, so a turn never sees half an
        update."""
        self.after_update: Any = None
        """Called under `weights_lock` right after an update's last optimizer step (async
        training bumps the sampler's policy version there, atomically with the weights)."""

    def _logprobs(self, batch: Any, model: Any = None, body: Any = None) -> torch.Tensor:
        return self.strategy.run(
            token_logprobs,
            model if model is not None else self.trained,
            batch.input_ids_B_T,
            batch.attention_mask_B_T,
            temperature=self.cfg.temperature,
            chunk_tokens=self.cfg.chunk_tokens,
            body=body,
            only_B_T=batch.loss_mask_B_T,  # the LM head runs on policy tokens only
            prefix_len=batch.prefix_len if body is None else 0,
        )

    def _reference_logprobs(self, batch: Any) -> torch.Tensor:
        assert self.reference is not None
        with torch.no_grad(), self.reference.active() as ref:
            return self._logprobs(batch, model=ref)

    def update(
        self,
        trajectories: Sequence[Trajectory],
        advantages: Sequence[float],
        *,
        lr_scale: float = 1.0,
        weights: Sequence[float] | None = None,
    ) -> dict[str, float]:
        """One policy update on these rows (advantage 0 rows still shape the mean).
        `lr_scale` multiplies the learning rate for this update only (staleness); `weights`
        (one per row, default 1) weigh the rows inside the loss's aggregation (an episode's
        samples share its weight: ``trainer.sample_weighting``)."""
        w = None if weights is None else [float(x) for x in weights]
        args = (_slim(trajectories), list(advantages), lr_scale, w) if self.channel else ()
        with self._on_every_rank("update", *args):
            return self.apply_update(trajectories, advantages, lr_scale=lr_scale, weights=w)

    def optimizer_state(self) -> dict[str, Any] | None:
        """The optimizer's whole state keyed by parameter name, for a checkpoint (gathered
        from every rank's shard onto rank 0); None before its first step (every rank has
        taken the same steps)."""
        if not self.optimizer.state:
            return None
        with self._on_every_rank("optimizer_state"):
            return self.strategy.optimizer_state(self.trained, self.optimizer)

    def load_state(self, optimizer_state: dict[str, Any] | None) -> None:
        """After a checkpoint's weights were loaded into `model`: the trained weights (every
        rank's) become them, and the optimizer takes `optimizer_state` (None: fresh)."""
        with self._on_every_rank("load"):
            self.strategy.load(self.model, self.trained, self.optimizer, optimizer_state)

    @contextlib.contextmanager
    def _on_every_rank(self, command: str, *args: Any) -> Iterator[None]:
        """Rank 0 of several: the other ranks are told to make this call too (`args`: what
        they need for it), and a transport failure inside it is a `RankLost`."""
        if self.channel is None:
            yield
            return
        from tracerl.train.distributed.ranks import RankLost, is_collective_failure

        self.channel.send(command, *args)
        try:
            yield
        except RuntimeError as e:
            if isinstance(e, RankLost) or not is_collective_failure(e):
                raise
            raise RankLost(
                f"the learner's {command!r} failed across the learner ranks (one stopped, "
                f"or lost its connection): {e}"
            ) from e

    def apply_update(
        self,
        trajectories: Sequence[Trajectory],
        advantages: Sequence[float],
        *,
        lr_scale: float = 1.0,
        weights: Sequence[float] | None = None,
    ) -> dict[str, float]:
        """`update` on this rank alone (the other ranks make the same call)."""
        while True:
            try:
                return self._apply_update(trajectories, advantages, lr_scale, weights)
            except torch.OutOfMemoryError as e:
                self._shrink_after(e, trajectories)
            # the failed attempt's tensors are gone with its traceback: return their memory
            if torch.cuda.is_available():
                torch.cuda.empty_cache()

    def _shrink_after(self, error: BaseException, rows: Sequence[Trajectory]) -> None:
        """An update ran out of device memory before the optimizer changed anything: halve
        the micro-batches (the gradient, accumulated over them, is the same update) and let
        the caller redo it; every later update keeps the smaller size. Raised again when it
        cannot help: the optimizer had stepped, several ranks share the update (they would
        fall out of step), or a micro-batch is already its longest row alone."""
        c = self.cfg
        self.optimizer.zero_grad(set_to_none=True)
        smallest = max((len(t.token_ids) for t in rows), default=1)  # a row is not split
        why = None
        if self._stepped:
            why = "after the optimizer stepped"
        elif self.strategy.ranks.world_size > 1:
            why = "across learner ranks"
        elif c.micro_batch_tokens <= smallest:
            why = f"with micro-batches already at a single row ({smallest} tokens)"
        if why is not None:
            raise torch.OutOfMemoryError(
                f"the learner ran out of device memory {why}; set a smaller "
                f"trainer.micro_batch_tokens (now {c.micro_batch_tokens}), turn on "
                f"trainer.gradient_checkpointing, or give the learner more memory: {error}"
            ) from error
        self.cfg = dataclasses.replace(
            c, micro_batch_tokens=max(smallest, c.micro_batch_tokens // 2)
        )
        self.shrunk += 1

    def _apply_update(
        self,
        trajectories: Sequence[Trajectory],
        advantages: Sequence[float],
        lr_scale: float,
        weights: Sequence[float] | None,
    ) -> dict[str, float]:
        c = self.cfg
        self._stepped = False
        share = c.share_prefix and self.strategy.shares_prefix
        share = share and not (c.gradient_checkpointing or c.compile)
        make_batches = shared_prefix_batches if share else bucketed_batches
        batches = make_batches(trajectories, advantages, c.micro_batch_tokens, weights=weights)
        total = sum(float(b.loss_mask_B_T.sum()) for b in batches)
        if total == 0:
            return {"train/policy_tokens": 0.0}
        weights = _micro_batch_weights(batches, self.cfg.clip.agg)
        clip = self.cfg.clip
        if clip.agg == "seq-mean-token-sum-norm" and clip.norm_tokens is None:
            # one constant for the whole step (not each micro-batch's padded width)
            width = max(b.input_ids_B_T.shape[1] for b in batches)
            clip = dataclasses.replace(clip, norm_tokens=width)
        n_batches = len(batches)
        mine, passes = self.strategy.shard([b.cost for b in batches])
        # built on the CPU; this rank's share moves to the trained weights' device once
        device = device_of(self.trained)
        batches, weights = [batches[i].to(device) for i in mine], [weights[i] for i in mine]
        refs = None
        if self.reference is not None:
            refs = [self._reference_logprobs(b) for b in batches]
            for _ in range(passes - len(batches)):  # a sharded reference's gathers pair up
                self._reference_logprobs(self._idle_batch(batches))
        sums: dict[str, float] = {}
        for group in self.optimizer.param_groups:
            group["lr"] = c.lr * lr_scale
        if self.progress is not None:  # an update takes a while: it shows it is moving
            self.progress.phase("update micro-batches", self.cfg.epochs * len(batches))
        with _training_mode(self.trained, self.cfg.gradient_checkpointing):
            grad_norm = self._epochs(batches, weights, refs, clip, sums, passes)
        sums = self.strategy.reduce_metrics(sums)
        self.updates += 1
        out = {f"train/{k}": v for k, v in sums.items()}
        out.update(
            {
                "train/grad_norm": grad_norm,
                "train/policy_tokens": total,
                "train/micro_batches": float(n_batches),
                # the size every micro-batch was cut to (halved after running out of memory)
                "train/micro_batch_tokens": float(c.micro_batch_tokens),
            }
        )
        return out

    def _epochs(
        self,
        batches: list[Any],
        weights: list[float],
        refs: list[torch.Tensor] | None,
        clip: ClipConfig,
        sums: dict[str, float],
        passes: int,
    ) -> float:
        """K epochs over this rank's micro-batches, then `passes - len(batches)` zero-loss
        passes (a sharded model's collectives need every rank's); adds the metrics into `sums`
        (each micro-batch weighted by its share, averaged over epochs; keys ending in ``_max``
        take the max over every micro-batch and epoch instead), returns the last gradient
        norm (of the whole step's gradient)."""
        olds: list[torch.Tensor] = []
        grad_norm = 0.0
        scale = self.strategy.loss_scale
        for epoch in range(self.cfg.epochs):
            self.optimizer.zero_grad(set_to_none=True)
            for i in range(passes):
                self.strategy.before_backward(last=i == passes - 1)
                if i >= len(batches):
                    self._idle_pass(batches)
                    continue
                b, share = batches[i], weights[i]
                lp = self._logprobs(b, body=self._body)
                if epoch == 0:  # the weights that sampled: the ratio's denominator
                    olds.append(lp.detach())
                inp = PolicyLossInput(
                    lp, olds[i], b.advantages_B, b.loss_mask_B_T, b.old_logprobs_B_T, b.weights_B
                )
                loss, m = ppo_clip(inp, clip)
                if refs is not None:
                    k = kl_estimate(self.cfg.kl_estimator, lp, refs[i])
                    mask = b.loss_mask_B_T.to(k.dtype)
                    kl_loss = aggregate(k, mask, clip.agg, clip.norm_tokens, b.weights_B)
                    loss = loss + self.cfg.kl_coef * kl_loss
                    m["kl"] = kl_loss.item()
                (loss * (share * scale)).backward()
                if self.progress is not None:
                    self.progress.advance()
                for key, v in {"loss": loss.item(), **m}.items():
                    if key.endswith("_max"):  # a max over the step, not a weighted mean
                        if share > 0:  # a micro-batch without policy tokens has no max
                            sums[key] = max(sums.get(key, v), v)
                    else:
                        sums[key] = sums.get(key, 0.0) + v * share / self.cfg.epochs
            self.strategy.reduce_gradients(self._params)
            grad_norm = self.strategy.clip(self._params, self.cfg.max_grad_norm)
            self._step(last=epoch == self.cfg.epochs - 1)
        return grad_norm

    def _step(self, last: bool) -> None:
        """The optimizer step; after the last epoch's, the sampler's weights are the new
        ones (`after_update` runs under the same lock)."""
        self._stepped = True  # from here, redoing the update would apply it twice
        if not self.strategy.shards_weights:  # the optimizer writes the sampler's weights
            with self.weights_lock:
                self.optimizer.step()
                if last and self.after_update is not None:
                    self.after_update()
            return
        self.optimizer.step()  # a sharded copy: the sampler reads on meanwhile
        if last:
            gathered = self.strategy.gather_weights()
            with self.weights_lock:
                self.strategy.publish(self.model, gathered)
                if self.after_update is not None:
                    self.after_update()

    def _idle_pass(self, batches: list[Any]) -> None:
        """A forward and backward whose loss is multiplied by zero: every parameter gets a
        (zero) gradient and joins the collectives, nothing changes."""
        (self._logprobs(self._idle_batch(batches)).sum() * 0.0).backward()

    def _idle_batch(self, batches: list[Any]) -> Batch:
        """Two tokens, the second a policy token (so the LM head runs too)."""
        device = device_of(self.trained)
        ids = batches[0].input_ids_B_T[:1, :2] if batches else torch.zeros(1, 2, dtype=torch.long)
        ids = ids.to(device)
        mask = torch.zeros(ids.shape, dtype=torch.float32, device=device)
        mask[:, -1] = 1.0
        return Batch(ids, torch.ones_like(ids), mask, torch.zeros_like(mask), mask[:, 0] * 0, [])


@contextlib.contextmanager
def _training_mode(model: Any, on: bool) -> Iterator[None]:
    """Train mode for the update when gradient checkpointing is on: transformers only
    checkpoints layers of a model in train mode. Back to eval after, for the sampler (which
    shares the model; SmolLM2 has no dropout, LoRA's dropout is 0 unless configured)."""
    if not on:
        yield
        return
    was = model.training
    model.train()
    try:
        yield
    finally:
        model.train(was)


def _slim(trajectories: Sequence[Trajectory]) -> list[Trajectory]:
    """What the other ranks need of a step's trajectories: the tokens, their authors and
    log-probs (not the steps, receipts and rewards)."""
    return [dataclasses.replace(t, steps=(), receipt=None, reward=None) for t in trajectories]
