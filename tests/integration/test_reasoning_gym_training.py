"""A reasoning-gym task family from a config alone: `tracerl check-env` passes on it, and the
example config trains a tiny model for two steps, its episodes scored by reasoning-gym's own
`score_answer`, evaluated on held-out questions, their receipts naming reasoning-gym's
release."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("reasoning_gym")

from tests.adapters import TINY, trains_two_steps
from tests.ownpkg import tracerl
from tracerl.config.loading import load_config
from tracerl.rollout.persist import read_run_trajectories

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "reasoning_gym_chain_sum.yaml"


def test_check_env_passes_on_a_reasoning_gym_family(tmp_path):
    result = tracerl(
        "check-env",
        "reasoning_gym",
        "--arg",
        "dataset=basic_arithmetic",
        "--arg",
        "config.max_terms=3",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "splits: train, heldout" in result.stdout and "FAIL" not in result.stdout
    assert "reward: attribution, score_answer; scripted episodes 2/2" in result.stdout


def test_the_example_config_trains_a_tiny_model_for_two_steps(tmp_path):
    from importlib.metadata import version

    cfg = load_config(CONFIG, [f"out_dir={tmp_path}", *TINY])
    trajs = trains_two_steps(cfg, "score_answer")
    run = cfg.run_dir
    release = f"reasoning-gym-{version('reasoning-gym')}/chain_sum"
    for t in trajs:
        r = t.receipt
        assert r["env"]["name"] == "reasoning_gym" and r["env"]["version"].endswith(release)
        assert r["task"]["split"] == "train" and r["task"]["dataset"] == "chain_sum"
        (scored,) = [c for c in t.reward["components"] if c["name"] == "score_answer"]
        assert scored["decided"] and t.reward["attribution"] == "policy"
    evaluated = [t for _, t in read_run_trajectories(run / "eval")]
    assert evaluated and all(t.receipt["task"]["split"] == "heldout" for t in evaluated)
