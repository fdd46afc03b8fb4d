"""Load times for SmolLM2-135M-Instruct: cold (dequantize the shipped GGUF) vs cached.

Run: .venv/bin/python benchmarks/model_load.py
Each load runs in a fresh process, so imports are counted the way a user meets them; the cold
load uses an empty temporary cache. Prints seconds and the cold/cached ratio.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

CHILD = """
import json, time
t0 = time.perf_counter()
from tracerl.models import load
t1 = time.perf_counter()
b = load("smollm2-135m-instruct")
print(json.dumps({"origin": b.origin, "import_s": b.info["import_s"], "load_s": b.load_seconds,
                  "total_s": time.perf_counter() - t0}))
"""


def run(cache: str) -> dict:
    env = {**os.environ, "TRACERL_CACHE": cache}
    out = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    with tempfile.TemporaryDirectory() as cache:
        t = time.perf_counter()
        cold = run(cache)
        cached = [run(cache) for _ in range(3)]
        wall = time.perf_counter() - t
    best = min(cached, key=lambda r: r["load_s"])
    for r in [cold, *cached]:
        print(
            f"{r['origin']:>6}: load {r['load_s']:6.2f} s  (+ {r['import_s']:.2f} s importing "
            f"torch/transformers; process total {r['total_s']:.2f} s)"
        )
    print(f"ratio cold/cached (best load): {cold['load_s'] / best['load_s']:.1f}x  [{wall:.0f} s]")


if __name__ == "__main__":
    main()
