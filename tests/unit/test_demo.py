"""The demo's displayed episode says who wrote its `policy` turns: the scripted reference
agent's are a script's, and its call to a tool that does not exist is deliberate."""

from __future__ import annotations

import asyncio

from tracerl.demo import CONFIG, MISTAKE, episode_header, reference_policy
from tracerl.envs import FaultInjector, make
from tracerl.rollout.groups import episode_member, run_groups


def test_the_header_says_a_script_wrote_the_turns_and_the_bad_call_is_deliberate(tiny):
    tasks = make("refund_desk").sample_tasks(1, seed=3)
    groups = asyncio.run(
        run_groups("refund_desk", tasks, reference_policy(tiny, tasks), CONFIG, group_size=2)
    )
    by_member = {episode_member(e.episode_id): e for g in groups for e in g}

    mistaken = episode_header("ref", by_member[1], tiny.model_id)
    assert "written by the scripted reference agent, not sampled from a model" in mistaken
    assert f"call to `{MISTAKE[0]}`, a tool that does not exist, is deliberate" in mistaken

    careful = episode_header("ref", by_member[0], tiny.model_id)
    assert "scripted reference agent" in careful and "deliberate" not in careful

    sampled = episode_header("model", by_member[0], tiny.model_id)
    assert f"sampled from {tiny.model_id}" in sampled and "scripted" not in sampled


def test_the_header_names_the_injected_faults(tiny):
    tasks = make("refund_desk").sample_tasks(1, seed=3)

    def env() -> FaultInjector:
        return FaultInjector(make("refund_desk"), rate=1.0, seed=1)

    groups = asyncio.run(
        run_groups(env, tasks, reference_policy(tiny, tasks), CONFIG, group_size=1)
    )
    header = episode_header("ref", groups[0][0], tiny.model_id)
    assert "injected by the FaultInjector" in header
