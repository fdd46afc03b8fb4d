"""One episode before the run: the environment resets on a training task, the episode ends
with an empty answer, and the run's reward scores it.

`prepare` checks what a config names (the environment and reward exist, the reward takes
what tracerl passes); this runs them once, the way every episode of the run will. A `reset`
that always raises makes every episode the environment's, and a reward that returns a
string every episode the evaluator's: neither teaches the policy anything, and without this
the run would train on nothing to its last step and exit 0. Here either is a two-line error
before anything is written (exit 2 from the CLI).

A judge (a reward that waits on a model) is not asked: its server may not be up yet, and
its failures are the evaluator's at run time, counted like any other.
"""

from __future__ import annotations

import asyncio
from typing import Any

from tracerl.config import ConfigError
from tracerl.envs.parsers import get_parser
from tracerl.rewards.run_reward import RunReward
from tracerl.rollout.budget import Budgets, RolloutConfig
from tracerl.rollout.episode import Policy
from tracerl.rollout.runner import run_episode
from tracerl.rollout.sampler import ScriptedSampler
from tracerl.types import Attribution, StopReason

REHEARSAL_ID = "preflight-rehearsal"


def rehearse(
    cfg: Any, task: dict[str, Any], reward: RunReward, *, reward_key: str, renderer: Any = None
) -> None:
    """Play one empty-answer episode of `task` and score it; a `ConfigError` naming the
    environment or the reward if either fails as it would on every episode."""
    if renderer is None:  # a character tokenizer built in memory: no model, no file read
        from tracerl.models.loading import char_tokenizer
        from tracerl.models.render import ChatRenderer

        renderer = ChatRenderer(char_tokenizer())
    parser = get_parser("json_list")
    answer = parser.format_answer("")
    sampler = ScriptedSampler.from_texts(renderer, lambda request: answer, logprob=0.0)
    policy = Policy(sampler, renderer, parser, "preflight")
    env = cfg.env.factory()()
    rollout = RolloutConfig(budgets=Budgets(steps=1), max_turn_tokens=64, reserve=None)
    episode = asyncio.run(
        run_episode(env, task, policy, rollout, seed=cfg.trainer.seed, episode_id=REHEARSAL_ID)
    )
    where = f"task {task.get('id')!r} of split {cfg.env.train_split!r}"
    if episode.stop_reason is StopReason.INFRA_FAILURE:
        raise ConfigError(
            f"env.name: environment {cfg.env.name!r} failed its first episode ({where}): "
            f"{episode.receipt.error or episode.stop_reason.value}",
            "every episode would be the environment's and train nothing: fix its reset/step "
            "(`tracerl check-env` runs it; `tracerl --debug` shows the traceback)",
        )
    if reward.blocking:
        return
    scored = reward.score_group([episode])[0] if reward.needs_group else reward(episode)
    if not scored.decided and scored.attribution is Attribution.EVALUATOR:
        raise ConfigError(
            f"{reward_key}: the reward could not score an episode ({where}): {scored.error}",
            "every episode would be the evaluator's and train nothing: make each component "
            "return a number (or a Score)",
        )
