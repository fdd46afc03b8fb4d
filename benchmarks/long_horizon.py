"""Long horizons on 2 CPU cores: context policies and sub-agents on `timeline`.

Run: .venv/bin/python benchmarks/long_horizon.py [--arms compact,delegate]
     [--seeds 0,1,2] [--out /tmp/long-horizon] [--set trainer.steps=8 ...]
     [--report]                       (only print the table of the runs done in --out)

`timeline` (src/tracerl/envs/timeline.py): SmolLM2-135M-Instruct opens 8 Wikipedia
articles and answers with the first year each mentions. A good episode's history is ~850
tokens; every arm has ``budgets.context_tokens: 512``. Per arm, one after another (each run
has both cores):

1. the warm start, once per arm (``<arm>-warm``): `tracerl train <config> trainer.steps=0`,
   SFT on the reference agent; its weights are the starting point of every seed;
2. per seed (``<arm>-s<seed>``): `tracerl train <config>` from those weights
   (``warm_start=null``), GRPO for ``trainer.steps``; its step-0 evaluation is the warm-started
   model under the seed's sampling, its last one the trained model.

Arms:

* ``compact``: configs/timeline.yaml as written (policy-written summaries);
* ``stop``: the compact arm's models evaluated on the same held-out tasks with
  ``rollout.context.policy=stop`` (`tracerl eval`): the episode ends ``context_overflow``
  before the last article. Its learner time per step comes from two GRPO steps under
  ``stop`` from the warm-started weights (``stop-train``). (Trained under ``stop`` from the
  start, a run has no warm start at all: the reference agent overflows too, so there is
  nothing to imitate, and ``tracerl train`` refuses it.)
* ``delegate``: configs/timeline-delegate.yaml (two sub-agents, four articles each).

Printed per arm: held-out success (every year right, `eval/heldout/success_rate`) after the
warm start and after GRPO, mean ± standard error over seeds and each seed's value; what the
long horizon costs per training episode (samples, tokens the learner ran, policy tokens),
the learner's time per step, the training compute and the wall time. A finished run is not
run again (delete its folder to redo it); while ``<out>/PAUSE`` exists, no new run starts.
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

ARMS = {
    "compact": "configs/timeline.yaml",
    "delegate": "configs/timeline-delegate.yaml",
}


def cli(folder: Path, name: str, args: list[str]) -> float:
    """`python -m tracerl.cli <args>`, logged to ``<folder>/<name>.log``; its wall time."""
    while (folder.parent / "PAUSE").exists():  # the machine is lent to something else: wait
        time.sleep(10)
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(folder / f"{name}.log", "w") as log:
        cmd = [sys.executable, "-m", "tracerl.cli", *args]
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=False).returncode
    if rc != 0:
        raise SystemExit(f"{folder.name}: tracerl {args[0]} failed ({rc}); see {folder}/{name}.log")
    return time.perf_counter() - t0


def export(run: Path, model_dir: Path) -> Path:
    """The run's last checkpoint as a Hugging Face folder (``model.spec=hf:<folder>``)."""
    import torch

    from tracerl.models import load

    if (model_dir / "config.json").exists():
        return model_dir
    ckpt = max((run / "checkpoints").glob("step_*"), key=lambda p: int(p.name[5:]))
    bundle = load("smollm2-135m-instruct")
    bundle.model.load_state_dict(torch.load(ckpt / "model.pt", map_location="cpu"))
    bundle.model.save_pretrained(model_dir)
    bundle.renderer.tokenizer.save_pretrained(model_dir)
    return model_dir


def warm(out: Path, arm: str, extra: list[str]) -> tuple[Path, dict[str, Any]]:
    """The arm's warm start (once): its weights and what it cost."""
    folder = out / f"{arm}-warm"
    done = folder / "result.json"
    if not done.exists():
        args = ["train", ARMS[arm], f"out_dir={folder}", "name=run", *extra, "trainer.steps=0"]
        wall = cli(folder, "train", args)
        result = summarize(folder / "run", wall)
        export(folder / "run", folder / "model")
        shutil.rmtree(folder / "run" / "checkpoints", ignore_errors=True)
        done.write_text(json.dumps(result, indent=1))
    return folder / "model", json.loads(done.read_text())


def train(out: Path, arm: str, seed: int, extra: list[str]) -> dict[str, Any]:
    """One seed's GRPO run from the arm's warm start (or its results, when it ran before)."""
    folder = out / f"{arm}-s{seed}"
    done = folder / "result.json"
    if done.exists():
        return json.loads(done.read_text())
    model, warmed = warm(out, arm, extra)
    args = ["train", ARMS[arm], f"out_dir={folder}", "name=run", f"trainer.seed={seed}"]
    args += [f"model.spec=hf:{model}", "env.parser=json_list", "warm_start=null", *extra]
    result = summarize(folder / "run", cli(folder, "train", args))
    # this seed's step-0 evaluation is the warm-started model under the seed's sampling
    result["warm_start_success"] = result.pop("baseline_success")
    result["train_compute_s"] += warmed["warm_start_s"]
    result.update(arm=arm, seed=seed, warm_start_s=warmed["warm_start_s"])
    if arm == "compact":  # the same models without compaction: the stop arm
        stop = evaluate_stop(folder, seed, extra, model)
        stop.update(arm="stop", seed=seed)
        (folder / "stop.json").write_text(json.dumps(stop, indent=1))
    done.write_text(json.dumps(result, indent=1))
    shutil.rmtree(folder / "run" / "checkpoints", ignore_errors=True)
    return result


def evaluate_stop(folder: Path, seed: int, extra: list[str], warmed: Path) -> dict[str, Any]:
    """The warm-started and the trained model, evaluated with ``rollout.context.policy=stop``
    on the compact run's held-out tasks."""
    trained = export(folder / "run", folder / "model")
    found: dict[str, dict[str, Any]] = {}
    for name, model in (("stop-eval-warm", warmed), ("stop-eval", trained)):
        args = ["eval", ARMS["compact"], f"model.spec=hf:{model}", "env.parser=json_list"]
        args += ["rollout.context.policy=stop"]
        # `tracerl eval --seed` is its trainer.seed: the held-out tasks and the sampling
        args += [*extra, "--seed", str(seed), "--out", str(folder / name)]
        wall = cli(folder, name, args)
        rows = (folder / name / "metrics.jsonl").read_text().splitlines()
        found[name] = next(r for r in map(json.loads, rows) if "eval/heldout/success_rate" in r)
        found[name]["wall_s"] = wall
    shutil.rmtree(trained, ignore_errors=True)
    ev, nan = found["stop-eval"], math.nan
    return {
        "heldout_success": float(ev["eval/heldout/success_rate"]),
        "heldout_years": float(ev.get("eval/heldout/reward/years", nan)),
        "overflow_rate": float(ev.get("eval/heldout/context/overflow_rate", nan)),
        "samples_per_episode": float(ev.get("eval/heldout/context/samples_per_episode", nan)),
        "warm_start_success": float(found["stop-eval-warm"]["eval/heldout/success_rate"]),
        "sample_tokens_per_episode": nan,
        "policy_tokens_per_episode": nan,
        "update_s_per_step": nan,
        "train_compute_s": 0.0,
        "wall_s": ev["wall_s"],
    }


def stop_train(out: Path, extra: list[str]) -> dict[str, Any]:
    """Two GRPO steps under ``stop`` from the compact warm start: the learner's time per step
    and the tokens per episode without compaction."""
    folder = out / "stop-train"
    done = folder / "result.json"
    if not done.exists():
        model, _ = warm(out, "compact", extra)
        args = ["train", ARMS["compact"], f"out_dir={folder}", "name=run", f"model.spec=hf:{model}"]
        args += [
            "env.parser=json_list",
            "warm_start=null",
            *extra,
            "trainer.steps=2",
            "rollout.context.policy=stop",
        ]
        result = summarize(folder / "run", cli(folder, "train", args))
        shutil.rmtree(folder / "run" / "checkpoints", ignore_errors=True)
        done.write_text(json.dumps(result, indent=1))
    return json.loads(done.read_text())


def summarize(run: Path, wall_s: float) -> dict[str, Any]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x]
    train_rows = sorted((r for r in rows if r.get("phase") == "train"), key=lambda r: r["step"])
    evals = [r for r in rows if r.get("phase") == "eval"]
    stage = {r.get("stage"): float(r["eval/heldout/success_rate"]) for r in evals}
    last = max((r for r in evals if r.get("stage") == "train"), key=lambda r: r["step"], default={})
    warm = sum(
        float(r.get("time/warm_start_s", 0.0)) for r in rows if r.get("phase") == "warm_start"
    )
    episodes = sum(float(r.get("train/episodes_sampled", 0.0)) for r in train_rows) or math.nan

    def per_episode(key: str) -> float:
        return sum(float(r.get(key, 0.0)) for r in train_rows) / episodes

    def mean(key: str) -> float:
        vals = [float(r[key]) for r in train_rows if key in r]
        return statistics.mean(vals) if vals else math.nan

    return {
        "heldout_success": float(last.get("eval/heldout/success_rate", math.nan)),
        "heldout_years": float(last.get("eval/heldout/reward/years", math.nan)),
        "warm_start_success": stage.get("warm_start"),
        "baseline_success": stage.get("baseline"),
        "samples_per_episode": mean("context/samples_per_episode"),
        "sample_tokens_per_episode": per_episode("train/sample_tokens"),
        "policy_tokens_per_episode": per_episode("train/policy_tokens"),
        "compaction_rate": mean("context/compaction_rate"),
        "overflow_rate": mean("context/overflow_rate"),
        "update_s_per_step": mean("time/update_s"),
        "train_compute_s": warm + sum(float(r.get("time/step_s", 0.0)) for r in train_rows),
        "warm_start_s": warm,
        "wall_s": wall_s,
        "steps": len(train_rows),
    }


def mean_se(values: list[float]) -> tuple[float, float]:
    values = [v for v in values if v is not None and not math.isnan(v)]
    if not values:
        return math.nan, math.nan
    if len(values) == 1:
        return values[0], math.nan
    return statistics.mean(values), statistics.stdev(values) / math.sqrt(len(values))


def table(results: list[dict[str, Any]], out: Path) -> str:
    """One row per arm; the stop arm's training costs come from ``stop-train``."""
    cost = out / "stop-train" / "result.json"
    if cost.exists():
        measured = json.loads(cost.read_text())
        keys = ("update_s_per_step", "sample_tokens_per_episode", "policy_tokens_per_episode")
        for r in results:
            if r["arm"] == "stop":
                r.update({k: measured[k] for k in keys})
    lines = [
        "| arm | held-out success (mean ± s.e.) | seeds | after warm start | years right | "
        "samples / episode | tokens the learner ran / episode | policy tokens / episode | "
        "overflowed | learner s / step | training compute | wall time |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm in dict.fromkeys(r["arm"] for r in results):
        rs = [r for r in results if r["arm"] == arm]
        m, se = mean_se([r["heldout_success"] for r in rs])

        def avg(key: str, rs: list[dict[str, Any]] = rs) -> float:
            return mean_se([r[key] for r in rs])[0]

        lines.append(
            f"| {arm} | {m:.3f} ± {se:.3f} | "
            + ", ".join(f"{r['heldout_success']:.3f}" for r in rs)
            + f" | {avg('warm_start_success'):.3f} | {avg('heldout_years'):.2f}"
            + f" | {avg('samples_per_episode'):.1f} | {avg('sample_tokens_per_episode'):.0f}"
            + f" | {avg('policy_tokens_per_episode'):.0f} | {avg('overflow_rate'):.0%}"
            + f" | {avg('update_s_per_step'):.1f} | {avg('train_compute_s') / 60:.1f} min"
            + f" | {avg('wall_s') / 60:.1f} min |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arms", default="compact,delegate")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--out", default="/tmp/long-horizon")
    ap.add_argument("--set", nargs="*", default=[], help="overrides for every arm")
    ap.add_argument("--report", action="store_true", help="print the table of --out's runs")
    args = ap.parse_args()
    out = Path(args.out)
    arms = args.arms.split(",")
    if args.report:
        found = [json.loads(f.read_text()) for f in sorted(out.glob("*-s*/result.json"))]
        found += [json.loads(f.read_text()) for f in sorted(out.glob("*/stop.json"))]
        arms = ["stop", *arms]
        found.sort(key=lambda r: (arms.index(r["arm"]) if r["arm"] in arms else 99, r["seed"]))
        print(table(found, out))
        return
    results = []
    for arm in arms:
        for seed in [int(s) for s in args.seeds.split(",")]:
            r = train(out, arm, seed, args.set)
            print(
                f"{arm} seed {seed}: held-out success {r['warm_start_success']:.3f} after the "
                f"warm start -> {r['heldout_success']:.3f}, {r['wall_s'] / 60:.1f} min",
                flush=True,
            )
            results.append(r)
            if arm == "compact":
                results.append(json.loads((out / f"compact-s{seed}" / "stop.json").read_text()))
    if "compact" in arms:
        cost = stop_train(out, args.set)
        print(
            f"stop, 2 GRPO steps from the warm start: learner {cost['update_s_per_step']:.1f} "
            f"s/step, {cost['sample_tokens_per_episode']:.0f} tokens the learner ran / episode",
            flush=True,
        )
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(table(results, out))


if __name__ == "__main__":
    main()
