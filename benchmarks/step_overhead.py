"""A training step's own time on a run of tiny episodes, this checkout against an earlier
commit, alternately on the same machine: what each episode's bookkeeping (its conversation,
receipt, reward, durable write, the sampler's queue) costs where the model costs least.

`configs/learn-arithmetic.yaml` trains a 2-layer character model on 4 tasks x 32 samples a
step, 2-token turns: a step is 128 episodes and two tiny forwards, so a per-episode cost of
a millisecond is a tenth of the step. Each side runs `tracerl train` on that config for
`--steps` steps in a process of its own (the baseline from a `git worktree` of `--baseline`,
with this checkout's virtual environment), and reports the sum of its steps' `time/step_s`
(and of its fastest three quarters, which a stray pause of the machine leaves alone).

Run: .venv/bin/python benchmarks/step_overhead.py [--baseline a86d4d1] [--steps 40] [--runs 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def step_seconds(src: Path, out: Path, steps: int) -> tuple[float, float]:
    """(all steps, fastest three quarters) of one `tracerl train` of learn-arithmetic whose
    code is `src` (a checkout's root)."""
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(src / "src")}
    cmd = [sys.executable, "-m", "tracerl.cli", "train", "configs/learn-arithmetic.yaml"]
    cmd += [f"out_dir={out}", f"trainer.steps={steps}", "trainer.checkpoint_every=10"]
    done = subprocess.run(cmd, cwd=src, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{src}: tracerl train failed (exit {done.returncode}):\n{done.stderr}")
    (metrics,) = out.glob("*/metrics.jsonl")
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    times = sorted(r["time/step_s"] for r in rows if "time/step_s" in r)
    return sum(times), sum(times[: len(times) * 3 // 4])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", default="a86d4d1", help="a commit to compare with")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--runs", type=int, default=2, help="runs of each side, alternately")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tracerl-step-overhead-") as tmp:
        old = Path(tmp) / "baseline"
        subprocess.run(
            ["git", "worktree", "add", "--detach", "-f", str(old), a.baseline],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        try:
            sides = {a.baseline: old, "this checkout": ROOT}
            got: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
            for _ in range(a.runs):
                for name, src in sides.items():
                    got[name].append(step_seconds(src, Path(tmp) / "out", a.steps))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=ROOT)
    print(f"learn-arithmetic, {a.steps} steps of 128 episodes: the steps' own time")
    print(f"  {'side':<16} {'all steps':>10} {'fastest 3/4':>12}   runs")
    med = {}
    for name, runs in got.items():
        med[name] = statistics.median(fast for _, fast in runs)
        each = " ".join(f"{fast:.2f}" for _, fast in runs)
        total = statistics.median(t for t, _ in runs)
        print(f"  {name:<16} {total:9.2f}s {med[name]:11.2f}s   {each}")
    print(
        f"  ratio (this checkout / {a.baseline}, fastest 3/4): "
        f"{med['this checkout'] / med[a.baseline]:.2f}"
    )


if __name__ == "__main__":
    main()
