"""An evaluation whose reward crashed on most episodes says so on its line: its success rate
measured the reward code, not the policy."""

from __future__ import annotations

from tracerl.config.loading import load_config
from tracerl.envs.arithmetic import SPLITS
from tracerl.train.loop import train


def fragile(completion: str, a: int, b: int) -> float:
    """A verifier with a bug: it crashes on the held-out sums (the rehearsal scores a
    training sum, so the run starts)."""
    if (a, b) in SPLITS["heldout"]:
        raise ZeroDivisionError("verifier bug")
    return float(completion.strip()[:1] == str((a + b) % 10))


def test_an_evaluation_mostly_crashed_by_its_reward_warns(tmp_path):
    cfg = load_config(
        "configs/learn-arithmetic.yaml",
        [
            f"out_dir={tmp_path}",
            "trainer.steps=0",
            "env.eval_tasks=8",
            "trainer.reward=tests.integration.test_eval_warning:fragile",
        ],
    )
    lines: list[str] = []
    train(cfg, log=lines.append)
    (line,) = [x for x in lines if x.startswith("eval (baseline")]
    assert "warning: the reward crashed on" in line and f"tracerl triage {cfg.run_dir}" in line
