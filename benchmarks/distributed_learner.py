"""The learner on 1 vs 2 processes: step time and peak memory per rank, on this machine.

Run: .venv/bin/python benchmarks/distributed_learner.py [--model smollm2-135m-instruct]
     [--rows 8] [--tokens 512] [--steps 3]

Each arm is one `torchrun --standalone` launch (one plain process for the baseline) that
builds the model and a `Learner` with the arm's strategy, then makes --steps updates on the
same synthetic step (--rows trajectories of --tokens tokens, half of them policy tokens, in
groups of 4 sharing a prompt) and reports, per rank:

  step_s     median wall time of an update after the first (warm-up) one
  peak_rss   the process's peak resident memory (ru_maxrss), and its increase over the
             model as loaded (what the learner added: gradients, optimizer state, shards,
             activations; fsdp2's rank 0 also keeps the unsharded model its sampler uses)
  params     parameter elements this rank holds for training (sharded: its shard)

The baseline is one process of 2 threads (all of this machine's cores); the 2-process arms
run 1 thread each, so they have the same cores, split. What 2 processes can buy here is
memory per rank (fsdp2), not speed: the speed-up of data parallelism needs a core (or a GPU)
per rank. The ratios are against the baseline measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ARMS = [("single", 1), ("ddp", 2), ("fsdp2", 2)]


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _step(rows: int, tokens: int):
    from tracerl.types import Segment, Trajectory

    rng = random.Random(0)
    out, adv = [], []
    for g in range(0, rows, 4):
        prompt = [rng.randrange(10, 40000) for _ in range(tokens // 2)]
        for _ in range(min(4, rows - g)):
            n = tokens - len(prompt)
            out.append(
                Trajectory(
                    (
                        Segment("prompt", prompt),
                        Segment(
                            "policy",
                            [rng.randrange(10, 40000) for _ in range(n)],
                            logprobs=[-rng.uniform(0.5, 6.0) for _ in range(n)],
                        ),
                    )
                )
            )
            adv.append(rng.uniform(-1, 1))
    return out, adv


def worker(args: argparse.Namespace) -> None:
    import torch

    from tracerl.models import load
    from tracerl.train.distributed import launched, make_strategy
    from tracerl.train.distributed.ranks import close_process_group, init_process_group
    from tracerl.train.learner import Learner, LearnerConfig

    ranks = launched()
    init_process_group(ranks, torch.device("cpu"), timeout_s=1800)
    model = load(args.model).model
    loaded = _rss_mb()
    learner = Learner(
        model,
        LearnerConfig(lr=1e-6, micro_batch_tokens=args.micro_batch_tokens),
        make_strategy(args.strategy, ranks),
    )
    trajs, adv = _step(args.rows, args.tokens)
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        learner.apply_update(trajs, adv)
        times.append(time.perf_counter() - t0)
    shards = [p.to_local() if hasattr(p, "to_local") else p for p in learner.trained.parameters()]
    held = sum(p.numel() for p in shards)
    result = {
        "rank": ranks.rank,
        "step_s": statistics.median(times[1:] or times),
        "peak_rss_mb": _rss_mb(),
        "model_rss_mb": loaded,
        "params": held,
    }
    Path(args.out, f"rank{ranks.rank}.json").write_text(json.dumps(result))
    close_process_group()


def run_arm(args: argparse.Namespace, strategy: str, nproc: int) -> list[dict]:
    out = Path(tempfile.mkdtemp(prefix=f"dist-{strategy}-"))
    me = [
        str(Path(__file__).resolve()),
        "--worker",
        f"--strategy={strategy}",
        f"--out={out}",
        f"--model={args.model}",
        f"--rows={args.rows}",
        f"--tokens={args.tokens}",
        f"--steps={args.steps}",
        f"--micro-batch-tokens={args.micro_batch_tokens}",
    ]
    if nproc == 1:
        cmd = [sys.executable, *me]
        threads = str(os.cpu_count() or 1)
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        cmd += [f"--nproc-per-node={nproc}", *me]
        threads = str(max(1, (os.cpu_count() or 1) // nproc))
    env = {**os.environ, "OMP_NUM_THREADS": threads}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{strategy}: failed\n{done.stderr[-3000:]}")
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--micro-batch-tokens", type=int, default=2048)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--strategy", default="single", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    print(
        f"{args.model}: {args.rows} x {args.tokens} tokens a step, micro-batches of "
        f"{args.micro_batch_tokens} tokens, {os.cpu_count()} cores"
    )
    header = f"{'arm':<10}{'rank':>5}{'step s':>9}{'x base':>8}"
    header += f"{'peak MB':>10}{'learner MB':>12}{'x base':>8}{'params M':>10}"
    print(header)
    base = None
    for strategy, nproc in ARMS:
        for r in run_arm(args, strategy, nproc):
            added = r["peak_rss_mb"] - r["model_rss_mb"]
            if base is None:
                base = (r["step_s"], added)
            print(
                f"{strategy + ' x' + str(nproc):<10}{r['rank']:>5}{r['step_s']:>9.2f}"
                f"{r['step_s'] / base[0]:>8.2f}{r['peak_rss_mb']:>10.0f}{added:>12.0f}"
                f"{added / base[1]:>8.2f}{r['params'] / 1e6:>10.1f}"
            )


if __name__ == "__main__":
    main()
