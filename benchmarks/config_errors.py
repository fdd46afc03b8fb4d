"""How fast a mistake in a config stops `tracerl train` (issue 40): the config is read and
checked before torch and the model stack load, so a typo costs what starting Python and the
command costs, not what loading a model costs.

Run: .venv/bin/python benchmarks/config_errors.py [--repeat 5]

For each mistake: the median wall time of `tracerl train configs/demo.yaml <mistake>` over
`--repeat` runs, whether torch was imported before the error (``-X importtime``), and the
ratio to two baselines measured in the same run: `tracerl --version` (the floor: Python and
the command) and `python -c "import torch"` (what the error would cost if it came after
torch). On an idle 2-core machine a mistake should take well under a second: measured
0.56-0.69 s per mistake, `tracerl --version` 0.14 s, `import torch` 1.87 s (5 runs each,
torch never loaded before the error). That broke unnoticed once (2026-12-02 to 12-05: a
config module imported a rollout module whose package loaded the samplers, 4.2-4.8 s per
mistake): `tests/contract/test_cli_errors.py` now checks that no mistake it lists loads
torch, transformers or numpy before it is told, except those that run an episode.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MISTAKES = {
    "unknown key (typo)": ["trainr.steps=2"],
    "bad value": ["trainer.lr=abc"],
    "unknown environment": ["env.name=nope"],
    "unknown model spec": ["model.spec=gpt-5"],
    "unknown corpus (env kwargs)": ["env.kwargs.corpus=nope"],
}


def timed(cmd: list[str]) -> tuple[float, int, str]:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    return time.perf_counter() - t0, r.returncode, r.stderr


def median_time(cmd: list[str], repeat: int) -> float:
    return statistics.median(timed(cmd)[0] for _ in range(repeat))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    py = sys.executable
    floor = median_time([py, "-m", "tracerl.cli", "--version"], a.repeat)
    torch = median_time([py, "-c", "import torch"], a.repeat)
    print(f"baseline `tracerl --version`: {floor:.2f} s;  `import torch`: {torch:.2f} s")
    print(f"{'mistake':<30} {'median s':>9} {'x version':>10} {'x torch':>8}  exit  torch loaded")
    for name, args in MISTAKES.items():
        cmd = [py, "-m", "tracerl.cli", "train", "configs/demo.yaml", *args]
        t = median_time(cmd, a.repeat)
        _, rc, err = timed([py, "-X", "importtime", *cmd[1:]])
        loaded = any(line.split("|")[-1].strip() == "torch" for line in err.splitlines())
        print(f"{name:<30} {t:>9.2f} {t / floor:>10.1f} {t / torch:>8.2f}  {rc:>4}  {loaded}")


if __name__ == "__main__":
    main()
