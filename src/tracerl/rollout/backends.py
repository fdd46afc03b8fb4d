"""Where a run's episodes run, chosen from its config: tracerl's episode runner in this
process (None), in Ray actors (`tracerl.rollout.ray_workers`), or an agent harness of the
user's through the gateway (``agent``: `tracerl.gateway.agent`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from tracerl.rollout.episode import Policy


@contextlib.contextmanager
def episode_backend(
    cfg: Any, bundle: Any, sampler: Any, policy: Policy, engine: Any = None
) -> Iterator[Any]:
    """The run's `RolloutBackend` (None: in process), started and stopped around the run."""
    if cfg.agent is not None:
        from tracerl.gateway.agent import agent_backend

        with agent_backend(cfg, policy, engine) as backend:
            yield backend
        return
    from tracerl.rollout.ray_workers import rollout_backend

    with rollout_backend(cfg, bundle, sampler, policy, engine) as backend:
        yield backend
