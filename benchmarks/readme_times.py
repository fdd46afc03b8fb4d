"""The README's times, measured as a user meets them (issue 40): each command run whole, as
a subprocess, beside a measure of how fast the machine is right now.

Run: .venv/bin/python benchmarks/readme_times.py [--repeat 2] [--vllm] [--demo-train]

Prints the machine (cores, CPU, load average before and after) and a fixed CPU reference
(fp32 matrix products: GFLOP/s, the median of 5), then for each command the wall time of
every run: `tracerl demo` on an empty cache (it converts SmolLM2's GGUF) and on a warm one,
the smoke run `tracerl train configs/learn-arithmetic.yaml`, a config typo, and with
`--vllm` a vLLM server start for SmolLM2 (benchmarks/vllm_start.py: its first start
compiles, the next loads the compile cache), with `--demo-train` the demo's training run
(configs/demo.yaml: minutes). The same machine has measured 2x apart on different days:
the reference says which kind of day a measurement came from. Runs write to a temporary
folder; nothing is left behind.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACERL = [sys.executable, "-m", "tracerl.cli"]
REFERENCE = """
import time, torch
torch.manual_seed(0)
a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
a @ b
runs = []
for _ in range(5):
    t0 = time.perf_counter()
    for _ in range(10):
        a @ b
    runs.append(10 * 2 * 1024**3 / (time.perf_counter() - t0) / 1e9)
print(sorted(runs)[2])
"""


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def machine() -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    cores = len(os.sched_getaffinity(0))
    return f"{cores} cores ({cpu_name()}), load average {load}"


def reference() -> float:
    out = subprocess.run([sys.executable, "-c", REFERENCE], capture_output=True, text=True)
    return float(out.stdout.strip())


def timed(cmd: list[str], env: dict[str, str], cwd: Path, status: int = 0) -> float:
    """`cmd`'s wall time; it must exit with `status`."""
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if r.returncode != status:
        raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return elapsed


def show(name: str, times: list[float]) -> None:
    each = ", ".join(f"{t:.1f}" for t in times)
    median = statistics.median(times)
    print(f"| {name} | {median:.1f} s | {each} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--vllm", action="store_true", help="also time vLLM server starts")
    ap.add_argument("--demo-train", action="store_true", help="also time configs/demo.yaml")
    a = ap.parse_args()
    print(f"{time.strftime('%Y-%m-%d %H:%M')}; {machine()}", flush=True)
    ref = reference()
    print(f"CPU reference: {ref:.1f} GFLOP/s (fp32 1024x1024 matmul)\n", flush=True)
    print("| command | median | each run (s) |\n|---|---|---|", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cache = work / "cache"
        env = {**os.environ, "TRACERL_CACHE": str(cache), "PYTHONPATH": str(ROOT / "src")}
        first = timed([*TRACERL, "demo", "--out", str(work / "demo0")], env, work)
        show("`tracerl demo`, empty cache (converts the GGUF)", [first])
        warm = [
            timed([*TRACERL, "demo", "--out", str(work / f"demo{i + 1}")], env, work)
            for i in range(a.repeat)
        ]
        show("`tracerl demo`, cached", warm)
        smoke = []
        for i in range(a.repeat):
            cmd = [*TRACERL, "train", str(ROOT / "configs/learn-arithmetic.yaml")]
            smoke.append(timed([*cmd, f"out_dir={work / f'smoke{i}'}"], env, work))
        show("`tracerl train configs/learn-arithmetic.yaml` (smoke run)", smoke)
        typo = [*TRACERL, "train", str(ROOT / "configs/demo.yaml"), "trainr.steps=2"]
        show("a config typo (`trainr.steps=2`)", [timed(typo, env, ROOT, 2) for _ in range(3)])
        if a.demo_train:
            demo = [*TRACERL, "train", str(ROOT / "configs/demo.yaml"), f"out_dir={work}"]
            show("`tracerl train configs/demo.yaml`", [timed(demo, env, work)])
        shutil.rmtree(work / "cache", ignore_errors=True)
    if a.vllm:
        print("\nvLLM server start (benchmarks/vllm_start.py --starts 2):", flush=True)
        subprocess.run([sys.executable, str(ROOT / "benchmarks/vllm_start.py"), "--starts", "2"])
    print(f"\nafter: {machine()}; CPU reference now {reference():.1f} GFLOP/s", flush=True)


if __name__ == "__main__":
    main()
