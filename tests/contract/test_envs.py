"""Every registered environment passes `check_env`; the checker catches broken ones."""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.scripts import scripted_policy
from tracerl.cli import app
from tracerl.envs import (
    EnvCheckError,
    RefundDesk,
    ToolEnv,
    ToolSet,
    make,
    register,
    registered,
    tool,
)
from tracerl.jsonl import write_trajectories
from tracerl.models.render import ChatRenderer
from tracerl.rollout.env_check import check_env
from tracerl.rollout.groups import run_group
from tracerl.rollout.persist import EpisodeWriter, read_run_trajectories, step_file


def _configured(name: str) -> dict:
    """The kwargs an environment needs to be one at all (an adapter: what it adapts)."""
    if name == "openenv":  # an OpenEnv server: the tests' arithmetic environment
        from tests.openenv_arith import openenv_python

        openenv_python()  # skips without openenv-core
        return {
            "app": "tests.openenv_arith.server:app",
            "check_actions": "tests.openenv_arith:solve",
        }
    if name == "verifiers":  # a verifiers taskset: the documented example's
        from tracerl.envs.adapters.verifiers.process import verifiers_python
        from tracerl.errors import UserError

        try:
            verifiers_python(None)
        except UserError as e:
            if os.environ.get("TRACERL_REQUIRE_VERIFIERS"):
                raise
            pytest.skip(f"verifiers is not installed: {e}")
        root = Path(__file__).resolve().parents[2]
        return {
            "taskset": "vf-last-digit",
            "taskset_config": {"num_tasks": 40},
            "path": [str(root / "examples" / "verifiers_envs")],
        }
    return {}


@pytest.mark.parametrize("name", registered())
def test_every_registered_env_passes_check_env(name, base_tokenizer):
    kwargs = _configured(name)
    env = (lambda: make(name, **kwargs)) if kwargs else name
    report = check_env(env, renderer=ChatRenderer(base_tokenizer))
    assert report.ok and len(report.passed) == 7
    labels = [p.split(":")[0] for p in report.passed]
    assert labels == [
        "versions",
        "schemas",
        "splits",
        "reset determinism",
        "step determinism",
        "dry runs",
        "reward",
    ]


def test_check_env_command():
    result = CliRunner().invoke(app, ["check-env", "refund_desk"])
    assert result.exit_code == 0, result.output
    assert "reset determinism" in result.stdout and "FAIL" not in result.stdout
    # says what it does before the slow parts, each check as it passes, the verdict last
    lines = result.stdout.splitlines()
    assert lines[0].startswith("check-env refund_desk: building the environment")
    assert lines[-1] == "check_env(refund_desk): ok"
    bad = CliRunner().invoke(app, ["check-env", "no_such_env"])
    assert bad.exit_code == 2 and "refund_desk" in bad.output


def test_registry_is_strict():
    register("refund_desk", RefundDesk)  # the same factory again: a re-imported module
    with pytest.raises(ValueError, match="already registered"):
        register("refund_desk", lambda **kw: RefundDesk(**kw))
    with pytest.raises(KeyError, match=r"registered: .*refund_desk"):
        make("no_such_env")


class Flaky(RefundDesk):
    """Draws its greeting from the global RNG: not reproducible from the seed."""

    async def setup(self, task, seed):
        messages = await super().setup(task, seed)
        messages[-1]["content"] += f" (ticket {random.randrange(10**9)})"
        return messages


class Unversioned(RefundDesk):
    version = ""


class LeakyDryRun(RefundDesk):
    """Ignores dry_run: refunds for real even under the guard."""

    @tool(effect="write", version="1")
    def issue_refund(self, order_id: str, amount: float, dry_run: bool = False):
        """Issue a refund.

        Args:
            order_id: the order.
            amount: dollars.
        """
        return RefundDesk.issue_refund.fn(self, order_id, amount, False)


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        (Flaky, "reset determinism"),
        (Unversioned, "versions"),
        (LeakyDryRun, "dry runs"),
    ],
)
def test_check_env_fails_broken_envs(env, problem):
    report = check_env(env, raise_on_failure=False)
    assert any(f.startswith(problem) for f in report.failed), str(report)
    with pytest.raises(EnvCheckError, match=problem):
        check_env(env)


def test_a_write_tool_without_dry_run_is_refused_at_registration():
    class Reckless(ToolEnv):
        name, version = "reckless", "1"

        @tool(effect="write")
        def send_email(self, to: str) -> str:
            """Send an email.

            Args:
                to: recipient.
            """
            return "sent"

        async def setup(self, task, seed):
            return [{"role": "user", "content": "hi"}]

        def sample_tasks(self, n, *, seed=0, split="train"):
            return [{"id": "t"}] * n

    with pytest.raises(ValueError, match=r"send_email.*no dry-run path"):
        Reckless()
    assert "send_email" in Reckless(side_effect_guard="off").tools  # explicit opt-out only
    with pytest.raises(ValueError, match="no dry-run path"):
        ToolSet([Reckless.send_email])


def test_replay_command_exit_codes(tiny, tmp_path):
    tasks = make("refund_desk").sample_tasks(1, seed=3)
    writer = EpisodeWriter(tmp_path / "run", step=0)
    episodes = asyncio.run(
        run_group(
            "refund_desk",
            tasks[0],
            scripted_policy(tiny.renderer, tasks),
            group_size=2,
            writer=writer,
        )
    )
    eid = episodes[0].episode_id
    ok = CliRunner().invoke(app, ["replay", str(tmp_path / "run"), "--episode", eid])
    assert ok.exit_code == 0, ok.output
    assert "replayed exactly" in ok.stdout
    by_replay_id = CliRunner().invoke(  # positional, as `show RUN EPISODE` takes it
        app, ["replay", str(tmp_path / "run"), episodes[1].receipt.replay_id]
    )
    assert by_replay_id.exit_code == 0, by_replay_id.output
    live = CliRunner().invoke(app, ["replay", str(tmp_path / "run"), "--episode", eid, "--live"])
    assert live.exit_code == 0 and "no drift" in live.stdout
    # Change one recorded token: exact replay must fail and say where.
    trajs = [t for _, t in read_run_trajectories(tmp_path / "run")]
    d = trajs[0].to_dict()
    d["segments"][0]["token_ids"][3] += 1
    trajs[0] = type(trajs[0]).from_dict(d)
    write_trajectories(step_file(tmp_path / "run", 0), trajs)
    bad = CliRunner().invoke(
        app, ["replay", str(tmp_path / "run"), "--episode", trajs[0].episode_id]
    )
    assert bad.exit_code == 1 and "token 3" in bad.stdout
    missing = CliRunner().invoke(app, ["replay", str(tmp_path / "run"), "--episode", "nope"])
    assert missing.exit_code == 2 and "episodes include" in missing.output


def test_arithmetic_held_out_sums_are_never_trained_on():
    env = make("arithmetic")
    train = {t["id"] for s in range(20) for t in env.sample_tasks(100, seed=s)}
    held = {t["id"] for s in range(20) for t in env.sample_tasks(100, seed=s, split="heldout")}
    assert len(train) == 80 and len(held) == 20 and not train & held
    with pytest.raises(ValueError, match="heldout"):
        env.sample_tasks(4, split="test")


def test_each_checks_line_is_told_as_soon_as_it_is_known():
    """`on_result` hears every line of the report, in the order the checks ran, each before
    the next check starts (a slow check is never silent about the ones before it)."""
    from tracerl.rollout.env_check import check_env

    heard: list[tuple[str, int]] = []
    started = {"n": 0}
    real = RefundDesk.reset

    async def counting(self, *args, **kwargs):
        started["n"] += 1
        return await real(self, *args, **kwargs)

    RefundDesk.reset = counting
    try:
        report = check_env("refund_desk", on_result=lambda line: heard.append((line, started["n"])))
    finally:
        RefundDesk.reset = real
    said = [line for line, _ in heard]
    assert said == [x for x in str(report).splitlines()[1:]], said  # the whole report
    assert [line.split()[1] for line in said[:3]] == ["versions", "schemas", "splits:"]
    resets = [n for _, n in heard]
    assert resets == sorted(resets) and resets[0] < resets[-1]  # told between the checks
