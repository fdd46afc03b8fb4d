"""The learner across processes: data-parallel (``ddp``) and sharded (``fsdp2``) training on
`torch.distributed`, launched with ``torchrun``.

* `tracerl.train.distributed.ranks` — who this process is (torchrun's ``RANK``, ``WORLD_SIZE``,
  ``LOCAL_RANK``) and the process group (gloo on CPU, NCCL on GPUs), with a collective
  timeout so a rank that hangs stops the run instead of freezing it.
* `tracerl.train.distributed.shards` — which micro-batches each rank runs: balanced by padded
  tokens (the cost of a forward and backward), not by count.
* `tracerl.train.distributed.strategy` — what differs between one process, ``ddp`` and ``fsdp2``
  inside one update: the model each rank trains, the loss scale, how gradients meet, the
  global gradient norm, the metrics summed over ranks, the weights handed back to rank 0's
  sampler, and full-state checkpoints.
* `tracerl.train.distributed.group` — rank 0 drives the run (rollouts, episodes, metrics,
  checkpoints, the report); it sends each learner call to the other ranks, which only
  learn (`follow`).

The step's loss is exactly the single-process one: every rank holds the whole step's
micro-batches, so token and sequence counts are global, and each rank runs its share.
"""

from tracerl.train.distributed.ranks import Ranks, launched
from tracerl.train.distributed.shards import balance
from tracerl.train.distributed.strategy import STRATEGIES, Strategy, make_strategy

__all__ = ["STRATEGIES", "Ranks", "Strategy", "balance", "launched", "make_strategy"]
