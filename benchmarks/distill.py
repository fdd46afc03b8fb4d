"""On-policy distillation against GRPO alone, on the demo's search task, on 2 CPU cores.

Run: .venv/bin/python benchmarks/distill.py [--arms distill,mixed,grpo] [--seeds 0,1,2]
     [--out /tmp/distill] [--start warm|untrained] [--task search|wiki]
     [--set trainer.steps=10 ...] [--report]

SmolLM2-135M-Instruct on `search` (configs/distill-search.yaml, configs/demo.yaml's task).
One after another (each run has both cores):

1. ``teacher``: configs/demo.yaml as `make demo` trains it (warm start, then GRPO): the
   teacher, its held-out success the bar;
2. ``warm``: the same warm start alone (``trainer.steps=0``), exported: every arm's start;
3. per arm and seed (``<arm>-s<seed>``), from the warm start (``--start untrained``: from
   the published model, which never answers in the task's format, ``<arm>-untrained-s<seed>``),
   evaluated every 2 steps:
   * ``distill``: ``trainer.distill`` with ``outcome_weight: 0`` (the teacher's grade only),
   * ``mixed``: ``outcome_weight: 1`` (the teacher's grade plus the outcome advantage),
   * ``grpo``: no teacher (the demo's GRPO).

Printed per arm: held-out success after the warm start and after each evaluation (mean ±
standard error over seeds), the student-sampled tokens spent to get there (the sum over
steps of the policy tokens its episodes sampled), the wall time, and the bar: the tokens
each arm needed to first reach 0.9 x the teacher's held-out success, against GRPO's. A
finished run is not run again (delete its folder to redo it).

``--task wiki``: the same recipe on configs/wiki-search.yaml (real Wikipedia summaries,
16 steps, evaluated every 4). The teacher is that config trained as it ships (seed 0),
taken at its best kept checkpoint by held-out success (``run:<teacher>@N``). Each arm runs
the config's own warm start (the teacher's, for the same seed) and then 16 steps; the
``grpo`` arm of seed 0 *is* the teacher's run (the same start, seed and steps), so it is
not run twice. Folders: ``<out>/wiki-teacher``, ``<out>/wiki-<arm>-s<seed>``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from long_horizon import cli, export  # the same run and export helpers

CONFIG = "configs/distill-search.yaml"
WIKI = "configs/wiki-search.yaml"
ARMS = {
    "distill": ["trainer.distill.outcome_weight=0"],
    "mixed": ["trainer.distill.outcome_weight=1"],
    "grpo": ["trainer.distill=null"],
}


def metrics(run: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x]


def curve(run: Path) -> list[tuple[int, float, float]]:
    """(step, student-sampled tokens so far, held-out success) at each evaluation (the
    warm start's at step 0, when there is one)."""
    rows = metrics(run)
    spent, by_step = 0.0, {}
    for r in rows:
        if r.get("phase") == "train":
            spent += r.get("cost/sampled_tokens_mean", 0.0) * r.get("train/episodes_sampled", 0)
            by_step[int(r["step"]) + 1] = spent  # an evaluation after step s: s + 1 updates
    out: dict[int, tuple[int, float, float]] = {}
    for r in rows:  # at step 0 the baseline, then the warm start's: the last one stands
        if r.get("phase") == "eval" and "eval/heldout/success_rate" in r:
            step = int(r.get("step", 0))
            out[step] = (step, by_step.get(step, 0.0), float(r["eval/heldout/success_rate"]))
    return [out[s] for s in sorted(out)]


def teacher(out: Path, extra: list[str]) -> tuple[Path, float, float]:
    folder = out / "teacher"
    done = folder / "result.json"
    if not done.exists():
        wall = cli(
            folder, "train", ["train", "configs/demo.yaml", f"out_dir={folder}", "name=run", *extra]
        )
        last = [r for r in metrics(folder / "run") if "eval/heldout/success_rate" in r][-1]
        done.write_text(json.dumps({"success": last["eval/heldout/success_rate"], "wall_s": wall}))
    got = json.loads(done.read_text())
    return folder / "run", got["success"], got["wall_s"]


def warm(out: Path, extra: list[str]) -> Path:
    folder = out / "warm"
    if not (folder / "model" / "config.json").exists():
        args = ["train", CONFIG, f"out_dir={folder}", "name=run", "trainer.steps=0"]
        cli(folder, "train", [*args, "trainer.distill=null", *extra])
        export(folder / "run", folder / "model")
    return folder / "model"


def wiki_teacher(out: Path, extra: list[str]) -> tuple[str, float, float]:
    """configs/wiki-search.yaml trained as it ships, evaluated every 4 steps: the reference
    to its best kept checkpoint (``run:<dir>@N``), that checkpoint's held-out success, and
    the wall time."""
    folder = out / "wiki-teacher"
    done = folder / "result.json"
    if not done.exists():
        args = ["train", WIKI, f"out_dir={folder}", "name=run", "trainer.eval_every=4", *extra]
        wall = cli(folder, "train", args)
        run = folder / "run"
        kept = {int(p.name[5:]) for p in (run / "checkpoints").glob("step_*")}
        # an evaluation after step s (s updates) scores checkpoint step_{s-1}
        scored = [
            (r["eval/heldout/success_rate"], int(r["step"]) - 1)
            for r in metrics(run)
            if r.get("phase") == "eval" and int(r.get("step", 0)) - 1 in kept
        ]
        success, step = max(scored)
        ref = f"run:{run}@{step}"
        done.write_text(json.dumps({"ref": ref, "success": success, "wall_s": wall,
                                    "curve": curve(run)}))  # fmt: skip
    got = json.loads(done.read_text())
    return got["ref"], got["success"], got["wall_s"]


def wiki_arm(out: Path, arm: str, seed: int, teacher_ref: str, extra: list[str]):
    folder = out / f"wiki-{arm}-s{seed}"
    if arm == "grpo" and seed == 0:  # the teacher's own run: the same start, seed and steps
        got = json.loads((out / "wiki-teacher" / "result.json").read_text())
        return {"curve": got["curve"], "wall_s": got["wall_s"]}
    done = folder / "result.json"
    if not done.exists():
        args = [
            "train", WIKI, f"out_dir={folder}", "name=run", f"trainer.seed={seed}",
            "trainer.eval_every=4", f"trainer.distill.teacher={teacher_ref}",
            *ARMS[arm], *extra,
        ]  # fmt: skip
        if arm == "grpo":
            args = [a for a in args if not a.startswith("trainer.distill")]
        wall = cli(folder, "train", args)
        done.write_text(json.dumps({"curve": curve(folder / "run"), "wall_s": wall}))
    return json.loads(done.read_text())


def arm_run(out: Path, arm: str, seed: int, spec: str, teacher_run: Path, extra: list[str]):
    tag = "" if spec.startswith("hf:") else "-untrained"
    folder = out / f"{arm}{tag}-s{seed}"
    done = folder / "result.json"
    if not done.exists():
        args = [
            "train", CONFIG, f"out_dir={folder}", "name=run", f"model.spec={spec}",
            "warm_start=null", f"trainer.seed={seed}", "trainer.eval_every=2",
            f"trainer.distill.teacher=run:{teacher_run}", *ARMS[arm], *extra,
        ]  # fmt: skip
        if arm == "grpo":
            args = [a for a in args if not a.startswith("trainer.distill.")]
        wall = cli(folder, "train", args)
        done.write_text(json.dumps({"curve": curve(folder / "run"), "wall_s": wall}))
    return json.loads(done.read_text())


def needed(points: list[list[float]], bar: float) -> float | None:
    """The student-sampled tokens spent when held-out success first reached `bar`."""
    return next((tokens for _, tokens, success in points if success >= bar), None)


def mean_se(xs: list[float]) -> str:
    if not xs:
        return "–"
    se = statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else 0.0
    return f"{statistics.mean(xs):.3f} ± {se:.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--arms", default="distill,mixed,grpo")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--out", type=Path, default=Path("/tmp/distill"))
    ap.add_argument("--set", nargs="*", default=[], help="overrides for every run")
    ap.add_argument("--start", choices=("warm", "untrained"), default="warm")
    ap.add_argument("--report", action="store_true", help="only print the runs done")
    ap.add_argument("--task", choices=("search", "wiki"), default="search")
    a = ap.parse_args()
    arms, seeds = a.arms.split(","), [int(s) for s in a.seeds.split(",")]
    t0 = time.perf_counter()
    results: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    if a.task == "wiki":
        ref, teacher_success, teacher_wall = wiki_teacher(a.out, a.set)
        for seed in seeds:
            for arm in arms:
                if a.report and not (a.out / f"wiki-{arm}-s{seed}" / "result.json").exists():
                    continue
                results[arm].append(wiki_arm(a.out, arm, seed, ref, a.set))
        name = f"configs/wiki-search.yaml, checkpoint step_{ref.rpartition('@')[2]}"
    else:
        teacher_run, teacher_success, teacher_wall = teacher(a.out, a.set)
        # the warm start's export, or the model as published (it never answers in the format)
        spec = f"hf:{warm(a.out, a.set)}" if a.start == "warm" else "smollm2-135m-instruct"
        tag = "" if a.start == "warm" else "-untrained"
        for seed in seeds:
            for arm in arms:
                if a.report and not (a.out / f"{arm}{tag}-s{seed}" / "result.json").exists():
                    continue
                results[arm].append(arm_run(a.out, arm, seed, spec, teacher_run, a.set))
        name = "configs/demo.yaml"
    bar = 0.9 * teacher_success
    print(f"teacher ({name}): held-out success {teacher_success:.3f} "
          f"({teacher_wall / 60:.1f} min); the bar: {bar:.3f}")  # fmt: skip
    grpo_needs = [needed(r["curve"], bar) for r in results.get("grpo", [])]
    for arm in arms:
        runs = results[arm]
        if not runs:
            continue
        steps = sorted({p[0] for r in runs for p in r["curve"]})
        print(f"\n{arm} ({len(runs)} seeds, {mean_se([r['wall_s'] / 60 for r in runs])} min each)")
        for step in steps:
            at = [p for r in runs for p in r["curve"] if p[0] == step]
            tokens = statistics.mean(p[1] for p in at)
            print(f"  after step {step:>2}: held-out {mean_se([p[2] for p in at])}, "
                  f"student-sampled tokens {tokens:,.0f}")  # fmt: skip
        needs = [needed(r["curve"], bar) for r in runs]
        reached = [n for n in needs if n is not None]
        spent = f", with {statistics.mean(reached):,.0f} sampled tokens" if reached else ""
        print(f"  reached {bar:.3f} in {len(reached)} of {len(runs)} seeds{spent}")
        if arm != "grpo" and reached and any(n is not None for n in grpo_needs):
            g = statistics.mean(n for n in grpo_needs if n is not None)
            print(f"  against GRPO's {g:,.0f}: {statistics.mean(reached) / g:.2f} of its tokens")
    print(f"\nwall time of this invocation: {(time.perf_counter() - t0) / 60:.1f} min")


if __name__ == "__main__":
    main()
