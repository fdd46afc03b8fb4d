"""`tracerl train` with a warm start: the reference agent's episodes are written like any
other, SFT on them lifts the model before RL, the three evaluations (baseline, after the
warm start, after RL) are recorded apart, and a resumed run does not warm-start twice."""

from __future__ import annotations

import json

from tracerl.config.loading import load_config
from tracerl.rollout.persist import read_run_trajectories
from tracerl.train.loop import train

ARGS = [
    "trainer.steps=1",
    "trainer.group_size=4",
    "env.eval_tasks=16",
    "warm_start.tasks=64",
    "warm_start.epochs=4",
    "warm_start.lr=3e-3",
    "trainer.micro_batch_tokens=256",
]


def _rows(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_warm_start_lifts_the_model_and_is_recorded_apart(tmp_path):
    cfg = load_config("configs/learn-arithmetic.yaml", [f"out_dir={tmp_path}", *ARGS])
    lines: list[str] = []
    train(cfg, log=lines.append)
    run = cfg.run_dir
    rows = _rows(run)
    evals = {r["stage"]: r for r in rows if r["phase"] == "eval"}
    assert list(evals) == ["baseline", "warm_start", "train"]
    key = "eval/heldout/reward_mean"
    # a random model rarely answers with a digit; the reference always does
    assert evals["baseline"][key] < 0.3
    assert evals["warm_start"][key] > evals["baseline"][key] + 0.3
    (ws,) = [r for r in rows if r["phase"] == "warm_start"]
    assert ws["warm_start/kept"] == ws["warm_start/episodes"] == 64
    assert ws["warm_start/nll_after"] < ws["warm_start/nll_before"]
    # the reference's episodes are on disk like any others, its own turns the only loss
    trajs = [t for _, t in read_run_trajectories(run / "warm_start")]
    assert len(trajs) == 64
    for t in trajs:
        trained = "".join(s.text or "" for s in t.policy_segments())
        assert trained == t.receipt["task"]["answers"][0] + "<|im_end|>"  # with its stop
    assert any("warm start: SFT on 64" in line for line in lines)

    # resuming (one more step) starts from the checkpoint: no second warm start
    more = load_config(
        "configs/learn-arithmetic.yaml", [f"out_dir={tmp_path}", *ARGS, "trainer.steps=2"]
    )
    train(more, resume=True, log=lines.append)
    rows = _rows(run)
    assert sum(r["phase"] == "warm_start" for r in rows) == 1
    assert [r["stage"] for r in rows if r["phase"] == "eval"] == [
        "baseline",
        "warm_start",
        "train",
        "train",
    ]
    assert [r["step"] for r in rows if r["phase"] == "train"] == [0, 1]
