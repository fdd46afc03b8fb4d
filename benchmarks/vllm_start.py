"""How long a vLLM server start takes, cold and with its compile cache (issue 40).

Run: .venv/bin/python benchmarks/vllm_start.py [--model smollm2-135m-instruct] [--starts 2]

Each start is a fresh `model.engine: vllm` engine (a server process over the model, as a run
starts it), timed from the call to a server answering ``/health``. The compile cache is a new
empty folder (``$TRACERL_CACHE/vllm``; the converted model is linked from your cache), so
the first start compiles and the later ones should load what it compiled. Prints each start's
seconds, vLLM's own "init engine" time (profile, KV cache, warm-up: where the compile is),
and the ratio of the later starts to the first. With ``--aot`` the server keeps vLLM's AOT
compile cache (``VLLM_USE_AOT_COMPILE=1``), which tracerl turns off because it does not load
back here: the baseline this measures against.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
START = """
import sys, time
from pathlib import Path
from tracerl.config import RunConfig
from tracerl.engines import open_engine
from tracerl.envs import get_parser
from tracerl.models import load
from tracerl.rollout.runner import Policy
spec, out = sys.argv[1], Path(sys.argv[2])
cfg = RunConfig(model={"spec": spec, "engine": "vllm", "vllm": {"kv_cache_gb": 0.25,
                "max_model_len": 1024, "executor": "uni"}})
bundle = load(spec)
policy = Policy.from_bundle(bundle, None, get_parser("json_list"))
t0 = time.perf_counter()
with open_engine(cfg, bundle, policy, out, log=lambda line: None):
    print(f"started {time.perf_counter() - t0:.1f}")
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--starts", type=int, default=2)
    ap.add_argument("--aot", action="store_true", help="keep vLLM's AOT compile cache on")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    from tracerl.cache import cache_dir

    models = cache_dir() / "models"
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache"
        cache.mkdir()
        if models.is_dir():
            (cache / "models").symlink_to(models)
        env = {**os.environ, "TRACERL_CACHE": str(cache)}
        env["PYTHONPATH"] = str(ROOT / "src")
        if a.aot:
            env["VLLM_USE_AOT_COMPILE"] = "1"
        times = []
        for i in range(a.starts):
            out = Path(tmp) / f"start{i}"
            t0 = time.perf_counter()
            r = subprocess.run(
                [sys.executable, "-c", START, a.model, str(out)],
                env=env,
                capture_output=True,
                text=True,
            )
            if r.returncode != 0:
                raise SystemExit(f"start {i} failed:\n{r.stderr[-2000:]}")
            served = float(r.stdout.split("started")[-1])
            log = (out / "engine" / "vllm.log").read_text()
            init = re.findall(r"init engine .* took ([0-9.]+) s", log)
            again = "Compiling model again" in log
            times.append(served)
            print(
                f"start {i + 1}: {served:.1f} s to /health (process {time.perf_counter() - t0:.1f}"
                f" s), init engine {init[-1] if init else '?'} s"
                f"{', compiled again: the cache did not load' if again else ''}",
                flush=True,
            )
    for i, t in enumerate(times[1:], start=2):
        print(f"start {i} / start 1: {t / times[0]:.2f}")


if __name__ == "__main__":
    main()
