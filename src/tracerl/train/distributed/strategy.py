"""What one update does differently on one process, with ``ddp`` and with ``fsdp2``.

The learner (`tracerl.train.learner.Learner`) builds the step's micro-batches and their loss
weights from the whole step on every rank (global token and sequence counts: the loss is
exactly the single-process one), then runs only its share (`shard`). A strategy supplies the
rest:

* ``single`` — one process; the learner as it always was.
* ``ddp`` — every rank holds the whole model (rank 0's is the one its sampler uses). After
  the micro-batches, gradients are summed across ranks, in flat buckets, once per optimizer
  step: what ``DistributedDataParallel`` does under ``no_sync`` with a last synchronised
  backward. Not the wrapper itself: the learner runs the decoder and the LM head apart
  (`tracerl.train.logprobs`), which the wrapper's forward hooks do not see, and ranks run
  unequal numbers of micro-batches. Every rank then clips on the same (global) gradient norm
  and takes the same optimizer step, so the replicas stay equal.
* ``fsdp2`` — parameters, gradients and optimizer state sharded with ``fully_shard``: one
  unit per decoder layer and a root unit (embeddings, final norm, LM head) around a module
  that runs the learner's own log-prob code, so the root's hooks gather what it needs. FSDP
  averages gradients over ranks, so each micro-batch's loss is scaled by the world size
  (gloo has no pre-scaled sum). Every rank runs as many forward/backward passes as the
  busiest one (collectives must match), the short ranks a two-token pass whose loss is
  multiplied by zero. The clipping norm is the global one (DTensor). After each update
  rank 0 gathers the trained weights (the LoRA adapters alone with LoRA) into its own
  unsharded model, the one its sampler and every weight sync read.

Checkpoints stay those of a single process: the model's full (or adapter) state dict, and
the optimizer's state keyed by parameter name (`tracerl.train.distributed.optimizer_state`),
gathered on rank 0; a single-process run resumes a sharded run's checkpoint and the reverse.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch

from tracerl.models.placement import Placement, placement_of
from tracerl.train.distributed.optimizer_state import (
    ROOT_PREFIX,
    load_named_optimizer_state,
    named_optimizer_state,
    with_prefix,
    without_prefix,
)
from tracerl.train.distributed.ranks import Ranks
from tracerl.train.distributed.shards import balance

STRATEGIES = ("single", "ddp", "fsdp2")
_BUCKET = 1 << 24  # elements per all-reduce (64 MB of fp32)


class Strategy:
    """One process: the learner as it always was."""

    name = "single"
    shares_prefix = True
    """Whether a micro-batch may run its rows' shared prompt once (two decoder calls)."""
    shards_weights = False
    """The trained weights are shards: after an update rank 0 gathers them into its model."""

    def __init__(self, ranks: Ranks | None = None) -> None:
        self.ranks = ranks or Ranks()

    @property
    def loss_scale(self) -> float:
        return 1.0

    def synchronize(self, model: Any) -> None:
        """Every rank's `model` becomes rank 0's (after a warm start only rank 0 trained)."""

    def prepare(self, model: Any) -> Any:
        """The module this rank trains (its parameters go to the optimizer)."""
        return model

    def run(self, fn: Callable[..., torch.Tensor], *args: Any, **kwargs: Any) -> torch.Tensor:
        """Run a forward computation of the trained module."""
        return fn(*args, **kwargs)

    def shard(self, costs: Sequence[int]) -> tuple[list[int], int]:
        """This rank's micro-batches (indices into the step's), and how many forward/backward
        passes every rank makes (more than its own: padded with zero-loss passes)."""
        return list(range(len(costs))), len(costs)

    def before_backward(self, last: bool) -> None:
        """Before each micro-batch's backward; `last`: the step's last one."""

    def reduce_gradients(self, params: Sequence[torch.nn.Parameter]) -> None:
        """After the step's last backward: gradients hold the whole step's."""

    def clip(self, params: Sequence[torch.nn.Parameter], max_norm: float) -> float:
        """Clip to the global norm; returns the norm before clipping."""
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))

    def reduce_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        """Per-rank metric sums to the step's (sums add, keys ending in ``_max`` take the max)."""
        return sums

    def gather_weights(self) -> dict[str, torch.Tensor] | None:
        """After an update: the weights rank 0's own model lacks (None: it trained them)."""
        return None

    def publish(self, model: Any, weights: dict[str, torch.Tensor] | None) -> None:
        """Write `gather_weights`' result into rank 0's model (under the sampler's lock)."""

    def optimizer_state(self, module: Any, optimizer: Any) -> dict[str, Any]:
        """The optimizer's full state keyed by parameter name (on rank 0; {} elsewhere)."""
        return named_optimizer_state(module, optimizer)

    def load(
        self, model: Any, module: Any, optimizer: Any, optimizer_state: dict[str, Any] | None
    ) -> None:
        """After a checkpoint was loaded into rank 0's `model`: every rank's trained `module`
        and optimizer take it (`optimizer_state`: rank 0's, or None for none saved)."""
        if optimizer_state is not None:
            load_named_optimizer_state(module, optimizer, optimizer_state)


class DataParallel(Strategy):
    name = "ddp"

    def synchronize(self, model: Any) -> None:
        _broadcast_module(model)

    def shard(self, costs: Sequence[int]) -> tuple[list[int], int]:
        mine = balance(costs, self.ranks.world_size)[self.ranks.rank]
        return mine, len(mine)

    def reduce_gradients(self, params: Sequence[torch.nn.Parameter]) -> None:
        import torch.distributed as dist

        # a parameter no rank used keeps no gradient (AdamW then leaves it alone, as alone)
        used = torch.tensor(
            [p.grad is not None for p in params], dtype=torch.int32, device=_comm_device()
        )
        dist.all_reduce(used, op=dist.ReduceOp.MAX)
        grads = []
        for p, u in zip(params, used.tolist(), strict=True):
            if u:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                grads.append(p.grad)
        for bucket in _buckets(grads):  # one dtype and device each: one flat all-reduce
            flat = torch.cat([g.reshape(-1) for g in bucket])
            dist.all_reduce(flat)
            for g, f in zip(bucket, flat.split([g.numel() for g in bucket]), strict=True):
                g.copy_(f.view_as(g))

    def reduce_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        return _merge_metrics(sums)

    def optimizer_state(self, module: Any, optimizer: Any) -> dict[str, Any]:
        return named_optimizer_state(module, optimizer) if self.ranks.main else {}

    def load(
        self, model: Any, module: Any, optimizer: Any, optimizer_state: dict[str, Any] | None
    ) -> None:
        _broadcast_module(module)
        _load_optimizer_everywhere(module, optimizer, optimizer_state, self.ranks)


class FullyShardedDataParallel(Strategy):
    name = "fsdp2"
    shares_prefix = False  # one decoder call per micro-batch: every rank's gathers pair up
    shards_weights = True

    def __init__(self, ranks: Ranks | None = None) -> None:
        super().__init__(ranks)
        self.root: Any = None
        self._trainable: set[str] = set()

    @property
    def loss_scale(self) -> float:
        return float(self.ranks.world_size)

    def synchronize(self, model: Any) -> None:
        _broadcast_module(model)

    def prepare(self, model: Any) -> Any:
        from torch.distributed.fsdp import fully_shard

        # rank 0 keeps its unsharded model for its sampler; the others shard theirs in place
        trained = copy.deepcopy(model) if self.ranks.main else model
        self._trainable = {n for n, p in trained.named_parameters() if p.requires_grad}
        self.root = _Root(trained)
        kw = _mixed_precision(placement_of(model))
        for layer in _decoder_layers(trained):
            fully_shard(layer, **kw)
        fully_shard(self.root, **kw)
        return trained

    def run(self, fn: Callable[..., torch.Tensor], *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.root(fn, *args, **kwargs)

    def shard(self, costs: Sequence[int]) -> tuple[list[int], int]:
        parts = balance(costs, self.ranks.world_size)
        return parts[self.ranks.rank], max(len(p) for p in parts)

    def before_backward(self, last: bool) -> None:
        # reduce-scatter after every micro-batch: deferring it to the last one would keep
        # an unsharded gradient of the whole model on every rank in between
        self.root.set_requires_gradient_sync(True)

    def clip(self, params: Sequence[torch.nn.Parameter], max_norm: float) -> float:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)

    def reduce_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        return _merge_metrics(sums)

    def _options(self, **kw: Any) -> Any:
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(full_state_dict=True, **kw)

    def gather_weights(self) -> dict[str, torch.Tensor] | None:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        state = get_model_state_dict(
            self.root, options=self._options(cpu_offload=True, ignore_frozen_params=True)
        )
        if not self.ranks.main:
            return None
        return {k.removeprefix(ROOT_PREFIX): v for k, v in state.items()}

    def publish(self, model: Any, weights: dict[str, torch.Tensor] | None) -> None:
        if weights is None:
            return
        missing = self._trainable - set(weights)
        if missing:
            raise RuntimeError(f"fsdp2: gathered weights lack {sorted(missing)[:3]}")
        device = next(model.parameters()).device
        with torch.no_grad():
            own = model.state_dict(keep_vars=True)  # tied weights under each name
            for name, value in weights.items():
                own[name].copy_(value.to(device))

    def optimizer_state(self, module: Any, optimizer: Any) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        options = self._options(cpu_offload=True)
        state = get_optimizer_state_dict(self.root, optimizer, options=options)
        return without_prefix(state) if self.ranks.main else {}

    def load(
        self, model: Any, module: Any, optimizer: Any, optimizer_state: dict[str, Any] | None
    ) -> None:
        from torch.distributed.checkpoint.state_dict import (
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        main = self.ranks.main
        weights = {ROOT_PREFIX + k: v for k, v in model.state_dict().items()} if main else {}
        set_model_state_dict(self.root, weights, options=self._options(broadcast_from_rank0=True))
        if _broadcast_flag(optimizer_state is not None, self.ranks):
            state = with_prefix(module, optimizer_state) if main else {}
            set_optimizer_state_dict(
                self.root, optimizer, state, options=self._options(broadcast_from_rank0=True)
            )


def make_strategy(name: str, ranks: Ranks | None = None) -> Strategy:
    ranks = ranks or Ranks()
    if name not in STRATEGIES:
        raise ValueError(f"unknown learner strategy {name!r}; valid: {', '.join(STRATEGIES)}")
    if name == "single" or not ranks.distributed:
        return Strategy(ranks)
    return {"ddp": DataParallel, "fsdp2": FullyShardedDataParallel}[name](ranks)


class _Root(torch.nn.Module):
    """FSDP's root unit: its forward runs the learner's log-prob code on the model inside,
    so the root gathers the embeddings, norm and LM head around it (and its backward hooks
    reduce their gradients)."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(self, fn: Callable[..., torch.Tensor], *args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)


def _mixed_precision(placement: Placement) -> dict[str, Any]:
    """``bf16-mixed``: FSDP2 gathers the fp32 master shards as bf16 for the forward and
    backward and reduces gradients in fp32 (`MixedPrecisionPolicy`); the optimizer keeps
    fp32 shards. Otherwise FSDP's default (the weights' own dtype throughout)."""
    if not placement.mixed:
        return {}
    from torch.distributed.fsdp import MixedPrecisionPolicy

    policy = MixedPrecisionPolicy(param_dtype=placement.compute, reduce_dtype=torch.float32)
    return {"mp_policy": policy}


def _decoder_layers(model: Any) -> list[torch.nn.Module]:
    layers = getattr(model.get_decoder(), "layers", None)
    if layers is None:
        raise ValueError(
            f"fsdp2: {type(model).__name__}'s decoder has no `layers` list to shard; "
            "use trainer.learner.strategy=ddp for this model"
        )
    return list(layers)


def _broadcast_module(module: Any) -> None:
    import torch.distributed as dist

    with torch.no_grad():
        for t in [*module.parameters(), *module.buffers()]:
            dist.broadcast(t.data, src=0)


def _buckets(tensors: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Consecutive runs of one dtype and device, each at most `_BUCKET` elements (one tensor
    larger than that is a bucket of its own)."""
    out: list[list[torch.Tensor]] = []
    size = 0
    for t in tensors:
        last = out[-1] if out else None
        if (
            last is None
            or size + t.numel() > _BUCKET
            or (t.dtype, t.device) != (last[0].dtype, last[0].device)
        ):
            out.append([])
            size = 0
        out[-1].append(t)
        size += t.numel()
    return out


def _merge_metrics(sums: dict[str, float]) -> dict[str, float]:
    import torch.distributed as dist

    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, sums)
    merged: dict[str, float] = {}
    for part in everyone:
        for key, v in part.items():
            if key.endswith("_max"):
                merged[key] = max(merged.get(key, v), v)
            else:
                merged[key] = merged.get(key, 0.0) + v
    return merged


def _broadcast_flag(flag: bool, ranks: Ranks) -> bool:
    import torch.distributed as dist

    t = torch.tensor([int(flag) if ranks.main else 0], device=_comm_device())
    dist.broadcast(t, src=0)
    return bool(t.item())


def _comm_device() -> torch.device:
    """Where the default group's small tensors live: NCCL takes GPU tensors only."""
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _load_optimizer_everywhere(
    module: Any, optimizer: Any, optimizer_state: dict[str, Any] | None, ranks: Ranks
) -> None:
    import torch.distributed as dist

    box = [optimizer_state if ranks.main else None]  # CPU tensors (restore maps them there)
    dist.broadcast_object_list(box, src=0)
    if box[0] is not None:
        load_named_optimizer_state(module, optimizer, box[0])
