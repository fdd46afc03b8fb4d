"""The reference agent: an environment's own scripted actions (`env.check_script(task)`)
written in a model family's action format and played, turn by turn, as a policy.

`check_env` plays it to score the env's verifier against its own script; the warm start
plays it to collect supervised episodes (`tracerl.train.warm_start`).
"""

from __future__ import annotations

import re
from typing import Any

from tracerl.envs.parsers import ActionParser
from tracerl.rollout.episode import Policy
from tracerl.rollout.groups import episode_task_id
from tracerl.rollout.sampler import ScriptedSampler

_SUB_AGENT = re.compile(r"(/d\d+)+$")


def reference_texts(
    env: Any, task: dict[str, Any], parser: ActionParser, child: int | None = None
) -> list[str]:
    """The reference agent's turns for `task`, as this model family writes them (those of
    its sub-agent `child`, ``check_child_script``, when given)."""
    texts = []
    actions = env.check_script(task) if child is None else env.check_child_script(task, child)
    for action in actions:
        if action.tool_calls:  # a note the script writes before its calls comes first
            calls = [(c.name, c.arguments) for c in action.tool_calls]
            note = f"{action.text}\n" if action.text else ""
            texts.append(note + parser.format_calls(calls))
        elif action.answer is not None:
            texts.append(parser.format_answer(action.answer))
        else:
            texts.append(action.text)
    return texts


def reference_policy(
    renderer: Any,
    model_id: str,
    probe: Any,
    tasks: list[dict[str, Any]],
    parser: ActionParser,
    summary_instruction: str | None = None,
) -> Policy:
    """A policy that plays `probe.check_script` for each of `tasks`, turn by turn (episodes
    named by `group_episode_id`, which says whose task each is). With a
    `summary_instruction` (a context that compacts with policy-written summaries,
    `tracerl.rollout.context`), a turn asked for a summary answers with
    `probe.check_summary(task, done)` (`done`: the script's actions played so far), and the
    script goes on after it."""
    scripts = {t["id"]: reference_texts(probe, t, parser) for t in tasks}
    by_id = {t["id"]: t for t in tasks}
    summaries: dict[str, int] = {}  # per episode: summaries written so far
    ask = renderer.encode(summary_instruction, content=True) if summary_instruction else []

    def turn(request: Any) -> str:
        eid = request.episode_id
        found = _SUB_AGENT.search(eid)  # a sub-agent's id: its root's, then its path
        root, agent = (eid[: found.start()], found.group(0)[1:]) if found else (eid, "")
        task_id = episode_task_id(root)
        texts = scripts[task_id]
        if agent:  # a sub-agent of the reference (``d0``, ``d1``): its own script
            child = int(agent.rsplit("/", 1)[-1][1:])
            texts = reference_texts(probe, by_id[task_id], parser, child)
        written = summaries.get(eid, 0)
        done = request.turn - written  # script turns played before this one
        tail = renderer.decode(list(request.prompt_ids[-(len(ask) + 24) :])) if ask else ""
        if ask and summary_instruction in tail:
            summaries[eid] = written + 1
            return _summary(probe, by_id[task_id], done, texts)
        return texts[min(done, len(texts) - 1)]

    sampler = ScriptedSampler.from_texts(renderer, turn, logprob=0.0)
    return Policy(sampler, renderer, parser, model_id)


def _summary(probe: Any, task: dict[str, Any], done: int, texts: list[str]) -> str:
    """The reference's summary: the environment's own (`check_summary`), or where its script
    stands."""
    own = getattr(probe, "check_summary", None)
    if own is not None:
        return own(task, done)
    return f"I have taken {done} of the {len(texts)} steps of my plan; next is step {done + 1}."
