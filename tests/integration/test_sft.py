"""SFT on a reference agent's successful episodes, with RL's own masks, teaches the task."""

from __future__ import annotations

import asyncio

from tracerl.envs import get_parser, make
from tracerl.models import load
from tracerl.rollout import HFSampler, ScriptedSampler
from tracerl.rollout.budget import Budgets, RolloutConfig
from tracerl.rollout.groups import run_groups
from tracerl.rollout.persist import EpisodeWriter
from tracerl.rollout.runner import Policy
from tracerl.train.sft import sft, sft_data

CFG = RolloutConfig(budgets=Budgets(steps=1), max_turn_tokens=2, reserve=None)


def _success(bundle, tasks) -> float:
    sampler = HFSampler(bundle.model, temperature=0.3, seed=0)
    policy = Policy(sampler, bundle.renderer, get_parser("json_list"), bundle.spec)
    groups = asyncio.run(run_groups("arithmetic", tasks, policy, CFG, group_size=1))
    answers = [(g[0].trajectories[0].policy_segments()[0].text or "")[:1] for g in groups]
    return sum(a == t["answers"][0] for a, t in zip(answers, tasks, strict=True)) / len(tasks)


def test_sft_on_successful_episodes_teaches_the_task(tmp_path):
    bundle = load("tiny-chars")
    tasks = make("arithmetic").sample_tasks(8, seed=3)
    by_id = {t["id"]: t for t in tasks}

    # the reference agent answers right in half of its episodes, wrong in the other half
    def turn(request):
        task = by_id[request.episode_id.rsplit(":s", 1)[0]]
        right = request.episode_id.endswith(("g0", "g2"))
        return task["answers"][0] if right else str((int(task["answers"][0]) + 1) % 10)

    reference = Policy(
        ScriptedSampler.from_texts(bundle.renderer, turn),
        bundle.renderer,
        get_parser("json_list"),
        bundle.spec,
    )
    run = tmp_path / "reference"
    groups = asyncio.run(
        run_groups("arithmetic", tasks, reference, CFG, group_size=4, writer=EpisodeWriter(run, 0))
    )
    assert sum(len(g) for g in groups) == 32
    data = sft_data(run, successful_only=False)
    assert len(data) == 32
    # keep only correct answers (what a reward would mark successful)
    good = [t for t in data if t.policy_segments()[0].text[:1] == t.receipt["task"]["answers"][0]]
    assert len(good) == 16
    before = _success(bundle, tasks)
    result = sft(bundle.model, good, lr=3e-3, epochs=60)
    after = _success(bundle, tasks)
    assert result.nll_after < result.nll_before / 3
    assert before < 0.3 and after >= 0.75, (before, after)
    # loss only on policy tokens: the prompt's log-likelihood is not what was trained
    assert all(sum(t.loss_mask) == 2 for t in good)  # the digit and the turn end


def test_sft_command_saves_a_loadable_model(tmp_path):
    from typer.testing import CliRunner

    from tracerl.cli import app

    bundle = load("tiny-chars")
    tasks = make("arithmetic").sample_tasks(2, seed=0)
    by_id = {t["id"]: t for t in tasks}
    reference = Policy(
        ScriptedSampler.from_texts(
            bundle.renderer, lambda r: by_id[r.episode_id.rsplit(":s", 1)[0]]["answers"][0]
        ),
        bundle.renderer,
        get_parser("json_list"),
        bundle.spec,
    )
    asyncio.run(
        run_groups(
            "arithmetic",
            tasks,
            reference,
            CFG,
            group_size=2,
            writer=EpisodeWriter(tmp_path / "run", 0),
        )
    )
    out = tmp_path / "tuned"
    args = ["sft", str(tmp_path / "run"), "--out", str(out), "--model", "tiny-chars"]
    refused = CliRunner().invoke(app, args)  # no rewards recorded: success is unknowable
    assert refused.exit_code == 2 and "carry no reward" in refused.output
    result = CliRunner().invoke(app, [*args, "--all", "--epochs", "3", "--lr", "1e-3"])
    assert result.exit_code == 0, result.output
    assert "4 trajectories" in result.stdout
    assert "before ->" in result.stdout and "after;" in result.stdout
    tuned = load(f"hf:{out}")
    assert tuned.renderer.start([{"role": "user", "content": "1+2="}]).token_ids
