"""What grading a code-repair episode costs, and what it can be fooled by: the in-process
unittest run (the grade read from the tested process's exit code and summary, as before
issue 18) against the grader (observations in the sandbox, the verdict outside it).

Run: .venv/bin/python benchmarks/coderepair_grading.py [--tasks 20] [--repeats 3]

For each of --tasks held-out tasks, both graders run on the buggy tree and on the fixed
tree, --repeats times each; the script prints the median wall time per grading, the ratio,
that both agree on every honest tree (buggy fails, fixed passes), and, for each hack in
`tests/unit/test_grader_hacks.py` applied to one task, which grader it fools.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import statistics
import sys
import time
from pathlib import Path

from tracerl.envs.coderepair.env import CodeRepair, grade_files, test_summary
from tracerl.envs.coderepair.sandbox import Limits, run_files
from tracerl.envs.coderepair.tasks import sample_tasks
from tracerl.envs.coderepair.templates import TEMPLATES


def in_process_unittest(task: dict, files: dict[str, str]) -> dict:
    """The old grade: hidden tests copied into the tree, `python -m unittest` run there."""
    r = run_files({**files, **task["hidden_tests"]}, list(task["test_command"]), Limits())
    return test_summary(r)


def timed(fn, *args) -> tuple[float, dict]:
    t0 = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - t0, out


def patched(task: dict, diff: str) -> dict[str, str]:
    env = CodeRepair()
    asyncio.run(env.reset(task, 0))
    result = asyncio.run(env.submit_patch({"unified_diff": diff}))
    assert "patch applied" in result.content, result.content
    return env.files


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    tasks = sample_tasks(args.tasks, seed=0, split="heldout")
    times: dict[str, list[float]] = {"unittest in process": [], "grader": []}
    agree = 0
    for task in tasks:
        fixed = {**task["files"], task["buggy_file"]: TEMPLATES[task["template"]].source}
        for files, want in ((task["files"], False), (fixed, True)):
            for _ in range(args.repeats):
                t_old, old = timed(in_process_unittest, task, files)
                t_new, new = timed(grade_files, task, files, Limits())
                times["unittest in process"].append(t_old)
                times["grader"].append(t_new)
            agree += old["ok"] == new["ok"] == want
    base = statistics.median(times["unittest in process"])
    print(f"{len(tasks)} held-out tasks, buggy and fixed trees, {args.repeats} repeats each")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:22s} median {med * 1000:6.1f} ms per grading   ({med / base:.2f}x)")
    print(f"  verdicts agree with the truth on {agree} of {2 * len(tasks)} trees")

    spec = importlib.util.spec_from_file_location(
        "hacks", Path(__file__).parents[1] / "tests" / "unit" / "test_grader_hacks.py"
    )
    hacks = importlib.util.module_from_spec(spec)
    sys.modules["hacks"] = hacks
    spec.loader.exec_module(hacks)  # type: ignore[union-attr]
    task = hacks.TASK
    cases = {k: hacks._replace(hacks.INIT, v) for k, v in hacks.HACKS.items()}
    cases |= {k: hacks._replace(hacks.MODULE, v) for k, v in hacks.MODULE_HACKS.items()}
    print("\nhacks (a patch instead of a fix): does the grade say 'all tests pass'?")
    print(f"  {'hack':62s} unittest-in-process  grader")
    for name, diff in cases.items():
        files = patched(task, diff)
        old, new = in_process_unittest(task, files)["ok"], grade_files(task, files, Limits())["ok"]
        print(f"  {name:62s} {'FOOLED' if old else 'ok':20s} {'FOOLED' if new else 'ok'}")


if __name__ == "__main__":
    main()
