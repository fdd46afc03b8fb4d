"""Training: batches from trajectories, memory-lean log-probs, the learner, a GRPO step.

(`tracerl train`, checkpoints, SFT and the learning demo come next.)
"""

from tracerl.train.batch import Batch, bucketed_batches, padded_batch
from tracerl.train.logprobs import token_logprobs

__all__ = ["Batch", "bucketed_batches", "padded_batch", "token_logprobs"]
