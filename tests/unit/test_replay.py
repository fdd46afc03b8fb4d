"""Replay: recorded episodes come back token for token; a changed tool output is caught."""

from __future__ import annotations

import asyncio
import copy
import dataclasses

from tests.scripts import scripted_policy
from tracerl.envs import FaultInjector, RefundDesk, make, tool
from tracerl.jsonl import write_trajectories
from tracerl.report.run import find_episode
from tracerl.rollout.budget import Budgets, RetryPolicy, RolloutConfig
from tracerl.rollout.groups import run_groups
from tracerl.rollout.live_replay import replay_live
from tracerl.rollout.persist import EpisodeWriter, read_run_trajectories, step_file
from tracerl.rollout.replay import replay_exact
from tracerl.types import Source

CONFIG = RolloutConfig(
    budgets=Budgets(steps=6, tool_calls=5), retry=RetryPolicy(max_retries=1, backoff_s=0.0)
)


def _record(tiny, run_dir, *, rate=0.3, n_tasks=4, group_size=4):
    tasks = make("refund_desk").sample_tasks(n_tasks, seed=9)
    writer = EpisodeWriter(run_dir, step=0)

    def env():
        return (
            FaultInjector(make("refund_desk"), rate=rate, seed=5) if rate else make("refund_desk")
        )

    policy = scripted_policy(tiny.renderer, tasks)
    groups = asyncio.run(
        run_groups(env, tasks, policy, CONFIG, group_size=group_size, seed=2, writer=writer)
    )
    return [e for g in groups for e in g]


def test_every_recorded_episode_replays_exactly(tiny, tmp_path):
    episodes = _record(tiny, tmp_path / "run")
    assert {e.stop_reason.value for e in episodes} >= {"answered"}
    for e in episodes:
        recorded = find_episode(tmp_path / "run", e.episode_id).trajectories
        report = asyncio.run(replay_exact(recorded, renderer=tiny.renderer))
        assert report.ok, (e.episode_id, report.first_difference)
        assert report.stop_reason == (e.stop_reason.value, e.stop_reason.value)


def _tamper(run_dir, episode_id, step, new_content):
    """Rewrite the run's file with one recorded tool output changed."""
    path = step_file(run_dir, 0)
    trajs = [t for _, t in read_run_trajectories(run_dir)]
    out = []
    for t in trajs:
        if t.episode_id == episode_id:
            steps = copy.deepcopy(list(t.steps))
            rec = next(s for s in steps if s["step"] == step)
            rec["attempts"][-1]["messages"][0]["content"] = new_content
            t = dataclasses.replace(t, steps=tuple(steps), _cache={})
        out.append(t)
    write_trajectories(path, out)


def test_a_changed_tool_output_is_the_first_difference(tiny, tmp_path):
    episodes = _record(tiny, tmp_path / "run", rate=0.0, n_tasks=2, group_size=2)
    e = episodes[0]
    _tamper(tmp_path / "run", e.episode_id, 0, "order lookup failed silently")
    report = asyncio.run(
        replay_exact(
            find_episode(tmp_path / "run", e.episode_id).trajectories, renderer=tiny.renderer
        )
    )
    assert not report.ok
    # The first difference lies inside step 0's first tool output, not anywhere earlier.
    traj = e.trajectories[0]
    start = 0
    for seg in traj.segments:
        if seg.source is Source.ENVIRONMENT and seg.step == 0:
            break
        start += len(seg.token_ids)
    index = int(report.first_difference.split("token ")[1].split(":")[0])
    assert start <= index < start + len(seg.token_ids), report.first_difference


class QueuedRefunds(RefundDesk):
    """The same desk after a service change: refunds are now 'queued', not 'issued'."""

    @tool(effect="write", timeout_s=5.0, version="2")
    def issue_refund(self, order_id: str, amount: float, dry_run: bool = False):
        """Issue a refund to the customer's original payment method.

        Args:
            order_id: the order to refund.
            amount: the amount in dollars, at most the order total.
        """
        result = RefundDesk.issue_refund.fn(self, order_id, amount, dry_run)
        result.content = result.content.replace("issued", "queued")
        return result


def test_live_replay_reports_drift_at_the_changed_step(tiny, tmp_path):
    episodes = _record(tiny, tmp_path / "run", rate=0.0, n_tasks=12, group_size=1)
    refunded = [
        e
        for e in episodes
        if any(
            c["action"]["tool"] == "issue_refund" and c["result"]["error"] is None
            for s in e.steps
            for c in s.get("calls", [])
        )
    ]
    assert refunded, "expected an episode with a successful refund"
    e = refunded[0]
    refund_step = next(
        s["step"]
        for s in e.steps
        if any(c["action"]["tool"] == "issue_refund" for c in s.get("calls", []))
    )
    recorded = find_episode(tmp_path / "run", e.episode_id).trajectories
    same = asyncio.run(replay_live(recorded))
    assert same.drifted == []
    changed = asyncio.run(replay_live(recorded, env=QueuedRefunds()))
    # the tool's version moved (1 -> 2) and its answer changed at the refund step
    assert [d.step for d in changed.drifted] == ["tools", refund_step]
    assert changed.drifted[0].detail == "issue_refund: recorded 1, live 2"
    assert "queued" in changed.drifted[1].detail


def test_a_replay_that_leaves_the_recording_says_how(tiny, tmp_path):
    """If the recorded policy tokens no longer lead to the recorded action (here: the record
    of what was sent was edited), the report names the step and both actions."""
    episodes = _record(tiny, tmp_path / "run", rate=0.0, n_tasks=1, group_size=1)
    recorded = find_episode(tmp_path / "run", episodes[0].episode_id).trajectories
    steps = copy.deepcopy(list(recorded[0].steps))
    steps[0]["attempts"][0]["calls"][0]["action"]["args"] = {"order_id": "A9999"}
    edited = [dataclasses.replace(recorded[0], steps=tuple(steps), _cache={})]
    report = asyncio.run(replay_exact(edited, renderer=tiny.renderer))
    assert not report.ok and "step 0: the replay sent" in report.first_difference
    assert "A9999" in report.first_difference


def test_live_replay_reports_a_failing_env_instead_of_crashing(tiny, tmp_path):
    episodes = _record(tiny, tmp_path / "run", rate=0.0, n_tasks=1, group_size=1)

    class Outage(RefundDesk):
        async def step(self, action):
            raise ConnectionError("refund service unreachable")

    report = asyncio.run(
        replay_live(
            find_episode(tmp_path / "run", episodes[0].episode_id).trajectories, env=Outage()
        )
    )
    assert report.steps[0].status == "same"  # reset still works
    assert report.drifted and all(d.status == "failed" for d in report.drifted)
    assert "unreachable" in report.drifted[0].detail


def test_a_replay_reads_the_models_tokenizer_without_loading_its_weights(
    tiny, tmp_path, monkeypatch
):
    """`tracerl replay` re-renders; it samples nothing: the receipt's model is read as its
    tokenizer and template alone (for SmolLM2 that was a whole model load, ~20 s)."""
    from tracerl.models import loading

    episodes = _record(tiny, tmp_path / "run", rate=0.0, n_tasks=1, group_size=1)
    recorded = find_episode(tmp_path / "run", episodes[0].episode_id).trajectories

    def no_weights(spec):
        raise AssertionError(f"replay loaded the weights of {spec}")

    monkeypatch.setattr(loading, "load", no_weights)
    monkeypatch.setattr("tracerl.models.load", no_weights)
    report = asyncio.run(replay_exact(recorded))  # the renderer from the receipt
    assert report.ok, report.first_difference


def test_a_specs_renderer_alone_is_the_one_its_model_loads_with():
    from tracerl.models import load
    from tracerl.models.refs import SPEC_TOKENIZERS, load_renderer

    for spec in SPEC_TOKENIZERS:
        if spec == "smollm2-135m-instruct":
            continue  # its weights take seconds to load: tests/integration/test_smollm2.py
        bundle = load(spec)
        assert load_renderer(spec).template_hash == bundle.renderer.template_hash, spec
        assert load_renderer(spec).tokenizer.get_vocab() == bundle.tokenizer.get_vocab(), spec
