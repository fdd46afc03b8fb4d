"""Training: batches from trajectories, memory-lean log-probs, the learner, a GRPO step,
and around them `tracerl train` (`loop`: synchronous, or `async_loop` with bounded
staleness), checkpoints and resume, SFT and the warm start (see docs/training.md).
"""

from tracerl.train.batch import Batch, bucketed_batches, padded_batch
from tracerl.train.logprobs import token_logprobs

__all__ = ["Batch", "bucketed_batches", "padded_batch", "token_logprobs"]
