"""The reference agent: an environment's own scripted actions (`env.check_script(task)`)
written in a model family's action format and played, turn by turn, as a policy.

`check_env` plays it to score the env's verifier against its own script; the warm start
plays it to collect supervised episodes (`tracerl.train.warm_start`).
"""

from __future__ import annotations

from typing import Any

from tracerl.envs.parsers import ActionParser
from tracerl.rollout.episode import Policy
from tracerl.rollout.groups import episode_task_id
from tracerl.rollout.sampler import ScriptedSampler


def reference_texts(env: Any, task: dict[str, Any], parser: ActionParser) -> list[str]:
    """The reference agent's turns for `task`, as this model family writes them."""
    texts = []
    for action in env.check_script(task):
        if action.tool_calls:
            calls = [(c.name, c.arguments) for c in action.tool_calls]
            texts.append(parser.format_calls(calls))
        elif action.answer is not None:
            texts.append(parser.format_answer(action.answer))
        else:
            texts.append(action.text)
    return texts


def reference_policy(
    renderer: Any, model_id: str, probe: Any, tasks: list[dict[str, Any]], parser: ActionParser
) -> Policy:
    """A policy that plays `probe.check_script` for each of `tasks`, turn by turn (episodes
    named by `group_episode_id`, which says whose task each is)."""
    scripts = {t["id"]: reference_texts(probe, t, parser) for t in tasks}

    def turn(request: Any) -> str:
        texts = scripts[episode_task_id(request.episode_id)]
        return texts[min(request.turn, len(texts) - 1)]

    sampler = ScriptedSampler.from_texts(renderer, turn, logprob=0.0)
    return Policy(sampler, renderer, parser, model_id)
