"""SmolLM2-135M-Instruct trained through a real agent framework, as it ships (issue 39).

Run: .venv/bin/python benchmarks/framework_smollm2.py [--seeds 0,1,2] [--out DIR]
     [--set key=value ...]

The agent is `examples/search_r1_langgraph.py`: a LangGraph graph (a model node and a search
node, no tracerl import) that searches a Search-R1 retrieval server and answers in tags. It
trains with `examples/search_r1_langgraph.yaml` (the demo's task: questions about a
generated world, held-out questions about countries never trained on; a warm start played
through the agent itself, then 10 GRPO steps). This script starts the retrieval server over
the synthetic corpus (what `tracerl serve-retriever --corpus synthetic` serves), points the
agent at it (``RETRIEVER_URL``) and runs `tracerl train` once per seed (``<out>/s<seed>``,
kept: a finished seed is not run again). It prints held-out success untrained, after the warm
start and after each evaluated GRPO step: per seed, and mean ± standard error over seeds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "examples" / "search_r1_langgraph.yaml"


def train(folder: Path, seed: int, retriever: str, extra: list[str]) -> dict[str, Any]:
    """One seed's run (once): its held-out curve and wall time, kept in result.json."""
    done = folder / "result.json"
    if done.exists():
        return json.loads(done.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    args = ["train", str(CONFIG), f"out_dir={folder}", "name=run", f"trainer.seed={seed}"]
    env = {**os.environ, "RETRIEVER_URL": retriever}
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH")])
    )
    t0 = time.perf_counter()
    with open(folder / "train.log", "w") as log:
        cmd = [sys.executable, "-m", "tracerl.cli", *args, *extra]
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT).returncode
    if rc != 0:
        raise SystemExit(f"seed {seed}: tracerl train failed ({rc}); see {folder}/train.log")
    rows = [json.loads(x) for x in (folder / "run" / "metrics.jsonl").read_text().splitlines()]
    curve = [
        [r.get("stage", "train"), int(r.get("step", 0)), r["eval/heldout/success_rate"]]
        for r in rows
        if r.get("phase") == "eval" and "eval/heldout/success_rate" in r
    ]
    result = {"seed": seed, "wall_s": time.perf_counter() - t0, "curve": curve}
    done.write_text(json.dumps(result, indent=1))
    return result


def mean_se(xs: list[float]) -> str:
    se = statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else 0.0
    return f"{statistics.mean(xs):.3f} ± {se:.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--out", type=Path, default=Path("runs/framework-smollm2"))
    ap.add_argument("--set", nargs="*", default=[], help="config overrides, key=value")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    from tracerl.envs.search.corpus import load_corpus
    from tracerl.envs.search.server import RetrievalServer

    seeds = [int(s) for s in a.seeds.split(",")]
    runs = []
    with RetrievalServer(load_corpus("synthetic")) as server:
        for seed in seeds:
            runs.append(train(a.out / f"s{seed}", seed, server.url, a.set))
            r = runs[-1]
            points = ", ".join(f"{stage}@{step} {s:.3f}" for stage, step, s in r["curve"])
            print(f"seed {seed} ({r['wall_s'] / 60:.1f} min): {points}", flush=True)
    print(f"\nheld-out success, mean ± s.e. over {len(runs)} seeds:")
    for i, (stage, step, _) in enumerate(runs[0]["curve"]):
        label = {"baseline": "untrained", "warm_start": "after the warm start"}.get(
            stage, f"after GRPO step {step}"
        )
        print(f"  {label:>24}: {mean_se([r['curve'][i][2] for r in runs])}")
    print(f"  wall time per seed: {mean_se([r['wall_s'] / 60 for r in runs])} min")


if __name__ == "__main__":
    main()
