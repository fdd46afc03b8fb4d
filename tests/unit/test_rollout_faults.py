"""A group through refund_desk under a 30% fault rate: every failure lands on its owner."""

from __future__ import annotations

import asyncio

from tests.scripts import MISTAKES, plan_of, scripted_policy
from tracerl.envs import FaultInjector, make
from tracerl.rollout.budget import Budgets, RetryPolicy, RolloutConfig
from tracerl.rollout.groups import rollout_metrics, run_groups
from tracerl.rollout.persist import EpisodeWriter, read_run_trajectories
from tracerl.types import Attribution, StopReason

CONFIG = RolloutConfig(
    budgets=Budgets(steps=8, tool_calls=6, write_actions=1),
    retry=RetryPolicy(max_retries=1, backoff_s=0.0),
)


def _run(tiny, tmp_path, *, rate: float):
    injectors: list[FaultInjector] = []

    def env():
        inj = FaultInjector(make("refund_desk"), rate=rate, seed=11)
        injectors.append(inj)
        return inj

    tasks = make("refund_desk").sample_tasks(6, seed=4)
    writer = EpisodeWriter(tmp_path / "run", step=0)
    groups = asyncio.run(
        run_groups(
            env,
            tasks,
            scripted_policy(tiny.renderer, tasks),
            CONFIG,
            group_size=8,
            seed=1,
            writer=writer,
        )
    )
    return [e for g in groups for e in g], injectors, writer


def _faults(step):
    """Every fault recorded in a step: each attempt's calls, and the final call records."""
    records = [c for a in step.get("attempts", []) for c in a.get("calls", [])]
    records += step.get("calls", [])
    return [c["result"]["error"] for c in records if c["result"]["error"]]


def test_faults_are_the_environments_and_mistakes_the_policys(tiny, tmp_path):
    episodes, injectors, writer = _run(tiny, tmp_path, rate=0.3)
    injected = [i for inj in injectors for i in inj.injected if i["fault"]]
    assert len(injected) >= 10  # the test means nothing without faults

    # Every injected fault is recorded, attributed to the environment.
    recorded = [f for e in episodes for s in e.steps for f in _faults(s) if f["injected"]]
    assert recorded and all(f["attribution"] == "environment" for f in recorded)
    by_episode = {e.episode_id: e for e in episodes}
    for e in episodes:
        kinds = [f["kind"] for s in e.steps for f in _faults(s) if f["injected"]]
        reached = e.stop_reason is StopReason.INFRA_FAILURE or "truncated_output" in kinds
        if reached:  # the fault shaped what the policy saw, or ended the episode
            assert e.attribution is Attribution.ENVIRONMENT
            assert not e.gradient_eligible
            assert e.receipt.gradient_eligible is False
        for s in e.steps:
            final = [c["result"]["error"] for c in s.get("calls", []) if c["result"]["error"]]
            if any(f["injected"] for f in final) or (
                s is e.steps[-1] and e.stop_reason is StopReason.INFRA_FAILURE
            ):  # the fault stands in the step's outcome: the step is the environment's
                assert s["infra_error"] and s["reward"]["attribution"] == "environment"
            elif any(f["injected"] for f in _faults(s)):  # retried away: invisible
                assert s["retried"] >= 1 and not s["infra_error"]
    assert any(e.stop_reason is StopReason.INFRA_FAILURE for e in episodes)

    # The deliberate mistakes are the policy's, and (in a healthy env) they are trainable.
    for e in episodes:
        mistake = MISTAKES.get(plan_of(e.episode_id))
        if mistake is None or len(e.steps) < 2 or e.steps[1].get("infra_error"):
            continue
        step = e.steps[1]
        assert step["policy_error"] and step["reward"]["attribution"] == "policy"
        kinds = {f["kind"] for f in _faults(step)} | {(step.get("fault") or {}).get("kind")}
        assert mistake in kinds
        if e.attribution is Attribution.POLICY:
            assert e.gradient_eligible

    # Nothing is lost: every started episode was written, and reads back.
    assert writer.episodes == len(episodes) == 6 * 8
    written = {t.episode_id for _, t in read_run_trajectories(tmp_path / "run")}
    assert written == set(by_episode)

    m = rollout_metrics(episodes)
    assert m["attribution/env_error_rate"] > 0 and m["attribution/policy_error_rate"] > 0
    assert m["stop/infra_failure"] > 0
    assert abs(sum(v for k, v in m.items() if k.startswith("stop/")) - 1.0) < 1e-9


def test_a_recovered_fault_is_invisible_to_the_policy(tiny, tmp_path):
    """A retried timeout leaves no trace in the tokens: the episode equals its clean run."""
    faulty, _, _ = _run(tiny, tmp_path / "faulty", rate=0.3)
    clean, _, _ = _run(tiny, tmp_path / "clean", rate=0.0)
    clean_by_id = {e.episode_id: e for e in clean}
    recovered = [
        e
        for e in faulty
        if e.attribution is Attribution.POLICY
        and any(f["injected"] for s in e.steps for f in _faults(s))
    ]
    assert recovered, "expected some episodes whose faults were retried away"
    for e in recovered:
        twin = clean_by_id[e.episode_id]
        assert e.trajectories[0].token_ids == twin.trajectories[0].token_ids
        assert e.gradient_eligible and e.stop_reason is twin.stop_reason


def test_a_set_up_that_fails_is_the_environments_and_is_done_before_the_clock(tiny):
    """`Env.prepare` runs before the episode's clock starts (its time is no step's); when
    it raises, the episode is the environment's failure, named in the receipt."""
    from tracerl.rollout.runner import run_episode

    class Unprepared(FaultInjector):
        def prepare(self):
            raise OSError("the index could not be built: disk full")

    class SlowToPrepare(FaultInjector):
        def prepare(self):
            import time

            time.sleep(3.0)  # longer than the episode's whole wall-time budget

    tasks = make("refund_desk").sample_tasks(1, seed=4)
    policy = scripted_policy(tiny.renderer, tasks)
    tight = RolloutConfig(budgets=Budgets(steps=8, tool_calls=6, wall_time_s=2.5))
    broken = Unprepared(make("refund_desk"), rate=0.0)
    ep = asyncio.run(run_episode(broken, tasks[0], policy, CONFIG))
    assert ep.stop_reason is StopReason.INFRA_FAILURE
    assert ep.attribution is Attribution.ENVIRONMENT and not ep.gradient_eligible
    assert ep.receipt.error == "prepare failed: OSError: the index could not be built: disk full"
    slow = SlowToPrepare(make("refund_desk"), rate=0.0)
    eid = f"{tasks[0]['id']}:s0:g0"  # the scripted policy's plan 0: it answers
    ep = asyncio.run(run_episode(slow, tasks[0], policy, tight, episode_id=eid))
    assert ep.stop_reason is not StopReason.TIMEOUT, ep.receipt.error
    assert ep.attribution is Attribution.POLICY, ep.receipt.error
