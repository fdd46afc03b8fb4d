"""`tracerl eval` writes per-split metrics and scored episodes (tiny model, few questions)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from tracerl.cli import app
from tracerl.rollout.persist import read_run_trajectories


def test_eval_writes_metrics_per_split_and_rewards_per_episode(tmp_path):
    out = tmp_path / "eval"
    args = ["eval", "--model", "tiny-random", "--n", "3", "--out", str(out)]
    result = CliRunner().invoke(app, [*args, "--split", "heldout", "--split", "train"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["split"] for r in rows] == ["heldout", "train"]
    for r in rows:
        s = r["split"]
        for key in ("success_rate", "searches_mean", "invalid_citation_rate", "latency_p95_s"):
            assert f"eval/{s}/{key}" in r
        assert abs(sum(v for k, v in r.items() if "/stop/" in k) - 1.0) < 1e-9
    trajs = [t for _, t in read_run_trajectories(out)]
    assert len({t.episode_id for t in trajs}) == 6
    assert all(t.reward and "components" in t.reward for t in trajs)
    bad = CliRunner().invoke(app, ["eval", "--model", "nope", "--out", str(tmp_path / "b")])
    assert bad.exit_code == 2 and "unknown model spec" in bad.output
    again = CliRunner().invoke(app, args)  # never written into a run that exists
    assert again.exit_code == 2 and "already holds a run" in again.output


def test_a_crashing_reward_is_counted_not_fatal(tiny, tmp_path):
    from tracerl.envs import get_parser
    from tracerl.evaluate import evaluate
    from tracerl.rewards import SEARCH_REWARD, RewardSpec
    from tracerl.rollout import ScriptedSampler
    from tracerl.rollout.runner import Policy

    spec = RewardSpec.from_yaml(
        SEARCH_REWARD.replace("fn: citations_valid,", "fn: citations_valid, params: {x: 1},")
    )
    parser = get_parser("json_list")
    answer = parser.format_calls([("answer", {"text": "x"})])
    policy = Policy(
        ScriptedSampler.from_texts(tiny.renderer, lambda r: answer), tiny.renderer, parser, "t"
    )
    m = evaluate(policy, n=2, out_dir=tmp_path / "e", reward_spec=spec)
    # the answers are wrong, so the em gate closes before the broken component: no crash
    assert m["eval/heldout/evaluator_error_rate"] == 0.0
    spec_first = RewardSpec.from_yaml(
        SEARCH_REWARD.replace("fn: answered,", "fn: answered, params: {x: 1},")
    )
    m = evaluate(policy, n=2, out_dir=tmp_path / "f", reward_spec=spec_first)
    assert m["eval/heldout/evaluator_error_rate"] == 1.0
    # a crash decides nothing: no success rate and no mean reward (undefined), never a 0
    assert "eval/heldout/success_rate" not in m and "eval/heldout/reward_mean" not in m
    assert m["eval/heldout/undecided_rate"] == 0.0  # a crash is no question for a person
