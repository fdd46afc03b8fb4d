"""The ``eval`` section: how every evaluation samples (`tracerl train`'s and `tracerl eval`'s).

Which tasks an evaluation plays is the environment's (``env.eval_split``, ``env.eval_tasks``,
``env.adversarial_eval_tasks``); this section says how the policy plays them.
"""

from __future__ import annotations

from pydantic import Field

from tracerl.config.base import _Config


class EvalConfig(_Config):
    temperature: float | None = Field(None, ge=0)
    """The evaluations' sampling temperature: 0 is greedy decoding (the most likely token:
    the same episodes every time); None: the training temperature (``model.temperature``).
    Training samples at ``model.temperature`` whatever this says."""
    samples_per_task: int = Field(1, ge=1)
    """Episodes played per evaluation task (k), each with its own seed. Reported beside
    ``success_rate`` (over the episodes whose reward decided) as ``mean@k`` (the tasks' mean
    success over their k samples) and ``pass@k`` (the share of tasks solved at least once in
    k), with standard errors across tasks (``*_stderr``). Greedy decoding plays k identical
    episodes: use k > 1 with a temperature above 0."""
