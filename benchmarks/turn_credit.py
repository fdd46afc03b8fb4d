"""Credit per turn and dynamic sampling on real Wikipedia questions: an ablation.

Run: .venv/bin/python benchmarks/turn_credit.py [--config configs/wiki-search.yaml]
     [--arms episode,turn_returns,step_groups] [--seeds 0,1] [--out /tmp/turn-credit]
     [--set trainer.steps=12 ...]     (overrides for every arm)
     [--report]                       (only print the table of the runs done in --out)

Each arm is one `tracerl train` of the config with ``trainer.credit`` set to the arm's
estimator (``dynamic`` arms: ``step_groups+dynamic`` adds ``trainer.dynamic_sampling``), one
run per seed, one after another (each has both cores). The same config otherwise: the same
warm start, tasks, group size, steps, so every arm without dynamic sampling samples the same
number of training episodes. A finished run is not run again (delete its folder to redo it); while
``<out>/PAUSE`` exists, no new run starts (so other work does not share the cores).

Held-out EM is the share of the held-out questions answered exactly
(``eval/heldout/success_rate``: the outcome component, exact match, reaching 1.0, over
every question, unanswered ones included; ``reward/em`` averages only the answers that
passed the format gate, so it reads higher). Printed per arm: the mean over seeds with its
standard error, each seed's value, the training episodes sampled, the training compute
(warm start plus steps, evaluations excluded) and the wall time of the whole run; and, for
arms that sampled more per step (dynamic sampling), the held-out EM of the last evaluation
reached within the first arm's training compute (equal wall time), read off the arm's
evaluation curve (give dynamic arms ``trainer.eval_every``).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

DYNAMIC = "+dynamic"


def arm_overrides(arm: str) -> list[str]:
    credit, dynamic = arm.removesuffix(DYNAMIC), arm.endswith(DYNAMIC)
    return [f"trainer.credit={credit}", *(["trainer.dynamic_sampling={}"] if dynamic else [])]


def run_dir(out: Path, arm: str, seed: int) -> Path:
    return out / f"{arm.replace('+', '-')}-s{seed}"


def train(config: str, out: Path, arm: str, seed: int, extra: list[str]) -> dict[str, Any]:
    """One run (or its results, when it finished before)."""
    folder = run_dir(out, arm, seed)
    done = folder / "result.json"
    if done.exists():
        return json.loads(done.read_text())
    while (out / "PAUSE").exists():  # the machine is lent to something else: wait
        time.sleep(10)
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "tracerl.cli",
        "train",
        config,
        f"out_dir={folder}",
        "name=run",
        f"trainer.seed={seed}",
        *arm_overrides(arm),
        *extra,
    ]
    t0 = time.perf_counter()
    with open(folder / "train.log", "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=False).returncode
    if rc != 0:
        raise SystemExit(f"{arm} seed {seed}: tracerl train failed ({rc}); see {folder}/train.log")
    result = summarize(folder / "run", time.perf_counter() - t0)
    result.update(arm=arm, seed=seed)
    done.write_text(json.dumps(result, indent=1))
    shutil.rmtree(folder / "run" / "checkpoints", ignore_errors=True)  # ~3 GB a run
    return result


def summarize(run: Path, wall_s: float) -> dict[str, Any]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x]
    compute, curve = 0.0, []
    warm = [r for r in rows if r.get("phase") == "warm_start"]
    compute += sum(float(r.get("time/warm_start_s", 0.0)) for r in warm)
    evals = {r["step"]: r for r in rows if r.get("phase") == "eval" and r.get("stage") == "train"}
    train_rows = sorted((r for r in rows if r.get("phase") == "train"), key=lambda r: r["step"])
    episodes = 0.0
    for r in train_rows:
        compute += float(r.get("time/step_s", 0.0))
        episodes += float(r.get("train/episodes_sampled", r.get("rollout/episodes", 0.0)))
        if r["step"] + 1 in evals:
            curve.append((compute, float(evals[r["step"] + 1]["eval/heldout/success_rate"])))
    stage = {
        r.get("stage"): float(r["eval/heldout/success_rate"])
        for r in rows
        if r.get("phase") == "eval" and r.get("stage") in ("baseline", "warm_start")
    }
    zero = [float(r.get("train/zero_signal_group_rate", 0.0)) for r in train_rows]
    resampled = [float(r.get("train/resampled_groups", 0.0)) for r in train_rows]
    return {
        "heldout_em": curve[-1][1] if curve else None,
        "baseline_em": stage.get("baseline"),
        "warm_start_em": stage.get("warm_start"),
        "curve": curve,
        "train_compute_s": compute,
        "wall_s": wall_s,
        "steps": len(train_rows),
        "episodes_sampled": episodes,
        "zero_signal_group_rate": statistics.mean(zero) if zero else None,
        "resampled_groups_per_step": statistics.mean(resampled) if resampled else 0.0,
    }


def em_within(curve: list[list[float]], budget_s: float) -> float | None:
    """The held-out EM of the last evaluation reached within `budget_s` of training compute."""
    reached = [em for t, em in curve if t <= budget_s * 1.02]
    return reached[-1] if reached else None


def mean_se(values: list[float]) -> tuple[float, float]:
    if not values:
        return math.nan, math.nan
    if len(values) == 1:
        return values[0], math.nan
    return statistics.mean(values), statistics.stdev(values) / math.sqrt(len(values))


def table(results: list[dict[str, Any]]) -> str:
    arms = list(dict.fromkeys(r["arm"] for r in results))
    reference = arms[0]
    budget = statistics.mean(r["train_compute_s"] for r in results if r["arm"] == reference)
    lines = [
        "| arm | held-out EM (mean ± s.e.) | seeds | warm start EM | zero-signal groups | "
        "replacements / step | training episodes | training compute | wall time | "
        f"EM at {reference}'s compute |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm in arms:
        rs = [r for r in results if r["arm"] == arm]
        m, se = mean_se([r["heldout_em"] for r in rs])
        at = [em_within(r["curve"], budget) for r in rs]
        at_m, at_se = mean_se([x for x in at if x is not None])
        equal = f"{at_m:.3f} ± {at_se:.3f}" if arm.endswith(DYNAMIC) else "–"
        lines.append(
            f"| {arm} | {m:.3f} ± {se:.3f} | "
            + ", ".join(f"{r['heldout_em']:.3f}" for r in rs)
            + f" | {statistics.mean(r['warm_start_em'] or 0.0 for r in rs):.3f}"
            + f" | {statistics.mean(r['zero_signal_group_rate'] or 0.0 for r in rs):.2f}"
            + f" | {statistics.mean(r['resampled_groups_per_step'] for r in rs):.1f}"
            + f" | {statistics.mean(r['episodes_sampled'] for r in rs):.0f}"
            + f" | {statistics.mean(r['train_compute_s'] for r in rs) / 60:.1f} min"
            + f" | {statistics.mean(r['wall_s'] for r in rs) / 60:.1f} min"
            + f" | {equal} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/wiki-search.yaml")
    ap.add_argument("--arms", default="episode,turn_returns,step_groups")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--out", default="/tmp/turn-credit")
    ap.add_argument("--set", nargs="*", default=[], help="overrides for every arm")
    ap.add_argument("--report", action="store_true", help="print the table of --out's runs")
    args = ap.parse_args()
    out = Path(args.out)
    if args.report:
        arms = args.arms.split(",")
        found = [json.loads(f.read_text()) for f in sorted(out.glob("*/result.json"))]
        found.sort(key=lambda r: (arms.index(r["arm"]) if r["arm"] in arms else 99, r["seed"]))
        print(table(found))
        return
    results = []
    for arm in args.arms.split(","):
        for seed in [int(s) for s in args.seeds.split(",")]:
            r = train(args.config, out, arm, seed, args.set)
            print(
                f"{arm} seed {seed}: held-out EM {r['heldout_em']:.3f} "
                f"(warm start {r['warm_start_em']:.3f}), {r['wall_s'] / 60:.1f} min",
                flush=True,
            )
            results.append(r)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(table(results))


if __name__ == "__main__":
    main()
