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
    bad = CliRunner().invoke(app, ["eval", "--model", "nope", "--out", str(out)])
    assert bad.exit_code == 2 and "unknown model spec" in bad.output
