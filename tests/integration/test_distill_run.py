"""On-policy distillation through the whole stack (`tracerl train` with ``trainer.distill``):
a tiny model trained by GRPO (the teacher, a run directory) teaches a fresh one of the same
kind with **no outcome signal at all** (``outcome_weight: 0``): the student's reward rises
anyway, toward the teacher's, and its reverse KL to the teacher falls. The dashboard shows
the distillation section and names the teacher."""

from __future__ import annotations

import json

from tracerl.config.loading import load_config
from tracerl.train.loop import train

COMMON = ["trainer.eval_every=0", "env.eval_tasks=8", "report.sinks=[jsonl]"]


def rows(run):
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("phase") == "train"]


def mean(xs):
    return sum(xs) / len(xs)


def test_a_trained_run_teaches_a_fresh_model_without_any_reward(tmp_path):
    teacher = load_config(
        "configs/learn-arithmetic.yaml",
        [f"out_dir={tmp_path}", "name=teacher", "trainer.steps=60", *COMMON],
    )
    train(teacher, log=lambda _: None)
    taught = mean([r["train/reward_mean"] for r in rows(tmp_path / "teacher")[-10:]])
    student = load_config(
        "configs/learn-arithmetic.yaml",
        [
            f"out_dir={tmp_path}",
            "name=student",
            "trainer.steps=30",
            f"trainer.distill.teacher=run:{tmp_path / 'teacher'}",
            "trainer.distill.outcome_weight=0",
            *COMMON,
        ],
    )
    train(student, log=lambda _: None)
    got = rows(tmp_path / "student")
    reward = [r["train/reward_mean"] for r in got]
    kl = [r["train/distill/reverse_kl"] for r in got]
    assert taught > 0.4, taught  # the teacher learned the answer's format
    assert mean(reward[:3]) < 0.3, reward[:3]  # a random student does not know it
    # no reward reached the update, yet the student climbs toward the teacher
    assert mean(reward[-5:]) > mean(reward[:3]) + 0.15, (reward[:3], reward[-5:])
    assert mean(kl[-5:]) < 0.5 * mean(kl[:3]), (kl[:3], kl[-5:])
    assert all(r["train/distill/coverage"] == 1.0 for r in got)
    assert all(r["train/distill/teacher_failures"] == 0.0 for r in got)
    print(f"teacher {taught:.2f}; student {reward[:3]} -> {reward[-5:]}; KL {kl[:3]} -> {kl[-5:]}")
    from tracerl.report.html import write_report

    html = write_report(tmp_path / "student").read_text()
    assert "Distillation" in html and f"run:{tmp_path / 'teacher'}" in html
    assert "teacher tokens per episode" in html  # the tool-cost curve counts the teacher
