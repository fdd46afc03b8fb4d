"""Are two `tracerl eval` runs' held-out numbers the same? (`make gpu-check`, part 3.)

`tracerl eval CONFIG ... --out DIR` writes DIR/metrics.jsonl (src/tracerl/cli/evaluate.py):
one row per evaluation, phase ``eval``, with ``eval/<split>/<metric>`` keys. This compares
the last such row of each run on every metric that is not a time (latencies depend on the
device, the outcomes must not: both runs draw their sampling uniforms from the same seeded
CPU generators, so the same weights give the same tokens up to floating-point ties).

Usage: python benchmarks/gpu_tools/compare_evals.py RUN_A RUN_B
Prints one line; exit status 0 when every compared number is the same, 1 when one differs,
2 when a run has no eval row.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HEADLINE = ("success_rate", "reward_mean")


def is_time(key: str) -> bool:
    """A duration (``latency_p95_s``, ``tool_latency_ms_mean``, ``time/...``)."""
    return "latency" in key or "time/" in key or key.endswith(("_s", "_ms"))


def last_eval(run: Path) -> dict[str, float] | None:
    """The last eval row's numeric metrics that are not times, or None."""
    path = run / "metrics.jsonl"
    if not path.is_file():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    evals = [r for r in rows if r.get("phase") == "eval"]
    if not evals:
        return None
    return {
        k: v
        for k, v in evals[-1].items()
        if k.startswith("eval/") and isinstance(v, int | float) and not is_time(k)
    }


def main() -> None:
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    a_dir, b_dir = Path(sys.argv[1]), Path(sys.argv[2])
    a, b = last_eval(a_dir), last_eval(b_dir)
    if a is None or b is None:
        missing = a_dir if a is None else b_dir
        print(f"no eval row in {missing}/metrics.jsonl")
        sys.exit(2)
    keys = sorted(set(a) | set(b))
    differ = [k for k in keys if a.get(k) != b.get(k)]
    head = ", ".join(
        f"{k.split('/')[-1]} {a[k]:.3f}" for k in keys if k.endswith(HEADLINE) and k in a
    )
    if not differ:
        print(f"same held-out numbers ({len(keys)} metrics): {head}")
        sys.exit(0)
    shown = "; ".join(f"{k}: {a.get(k)} vs {b.get(k)}" for k in differ[:6])
    print(f"DIFFERENT in {len(differ)} of {len(keys)} metrics: {shown}")
    sys.exit(1)


if __name__ == "__main__":
    main()
