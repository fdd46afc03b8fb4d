"""`check_env`: what every environment must pass before it is trained on.

The checks themselves are the environment contract (`tracerl.envs.check`: versions, schemas,
splits, reset and step determinism, dry runs, the env's own reward, MCP servers); the reward
check needs episodes, and this layer plays them: the env's `check_script` written by the
reference agent (`tracerl.rollout.reference`) and run through the episode runner, like a
model's episodes.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from tracerl.envs.base import Env
from tracerl.envs.check import CheckReport, EnvCheckError, run_env_checks
from tracerl.envs.parsers import get_parser
from tracerl.rollout.budget import Budgets, RolloutConfig
from tracerl.rollout.episode import Episode
from tracerl.rollout.groups import group_episode_id
from tracerl.rollout.reference import reference_policy
from tracerl.rollout.runner import run_episode

__all__ = ["CheckReport", "EnvCheckError", "check_env", "scripted_episodes"]


def check_env(
    env: str | Callable[[], Env],
    *,
    renderer: Any = None,
    seed: int = 0,
    raise_on_failure: bool = True,
    label: str | None = None,
    on_result: Callable[[str], None] | None = None,
) -> CheckReport:
    """Check an environment (a name `make` resolves, or a zero-argument factory);
    `on_result` is told each check's line as it is known."""
    return run_env_checks(
        env,
        scripted_episodes,
        renderer=renderer,
        seed=seed,
        raise_on_failure=raise_on_failure,
        label=label,
        on_result=on_result,
    )


async def scripted_episodes(
    factory: Callable[[], Env], probe: Env, tasks: list[dict[str, Any]], renderer: Any, seed: int
) -> list[Episode]:
    """`check_script` played through the rollout engine by the warm start's reference agent."""
    if renderer is None:  # SmolLM2's (a tokenizer of every byte: code and patches survive)
        from tracerl.models.loading import smollm2_tokenizer
        from tracerl.models.render import ChatRenderer

        renderer = ChatRenderer(smollm2_tokenizer())
    policy = reference_policy(renderer, "check-env", probe, tasks, get_parser("json_list"))
    # the budgets give the script room to finish: the check is of the verifier, and a long
    # script (a long-horizon environment's) must not be cut off by the default budgets
    scripts = [probe.check_script(t) for t in tasks]
    turns = max((len(a) for a in scripts), default=0)
    calls = max((sum(len(x.tool_calls) for x in a) for a in scripts), default=0)
    d = Budgets()
    budgets = Budgets(steps=max(d.steps, turns + 1), tool_calls=max(d.tool_calls or 0, calls + 1))
    config = RolloutConfig(max_turn_tokens=4096, budgets=budgets)
    # ids of their own (the position; a tag new at every check): a server keyed by the
    # episode id gives each scripted episode an empty world, however often check-env runs
    stage = f"check-{uuid.uuid4().hex[:12]}"
    return [
        await run_episode(
            factory(),
            t,
            policy,
            config,
            seed=seed,
            episode_id=group_episode_id(t, seed, 0, i, stage),
        )
        for i, t in enumerate(tasks)
    ]
