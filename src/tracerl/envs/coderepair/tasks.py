"""Code-repair tasks: small Python repositories, each with one seeded bug of a known kind, a
report of its symptom, visible tests and hidden acceptance tests.

Deterministic in (template, bug kind, seed): the seed picks the package's name, so two tasks
of one site differ in paths and imports. Splits keep held-out tasks new: a task is held out
when its template or its bug kind is (`HELDOUT_TEMPLATES`, `HELDOUT_KINDS`); training never
sees either. `load_task_folder` turns a user's repository into a task of the same shape.
"""

from __future__ import annotations

import difflib
import random
from pathlib import Path
from typing import Any

from tracerl.envs.coderepair.grader import compile_suite
from tracerl.envs.coderepair.templates import BUG_KINDS, TEMPLATES

HELDOUT_TEMPLATES = ("inventory",)
HELDOUT_KINDS = ("swapped_arguments", "exception_not_raised")
SPLITS = ("train", "heldout")
# -P: the work tree is not on sys.path until discovery adds it, so a module the agent plants
# at its root (unittest.py, sitecustomize.py) cannot replace the test runner
TEST_COMMAND = ["python3", "-P", "-m", "unittest", "discover", "-s", "tests", "-t", "."]
FORBIDDEN = ["tests/", "unittest", "sitecustomize.py", "usercustomize.py"]
PACKAGES = ("acme", "toolbox", "helpers", "kit", "common", "core", "shop", "tally")


def split_of(template: str, kind: str) -> str:
    return "heldout" if template in HELDOUT_TEMPLATES or kind in HELDOUT_KINDS else "train"


def combos(split: str) -> list[tuple[str, str]]:
    if split not in SPLITS:
        raise ValueError(f"unknown code-repair split {split!r}; valid: {', '.join(SPLITS)}")
    return [(t, k) for t in TEMPLATES for k in BUG_KINDS if split_of(t, k) == split]


def make_task(template: str, kind: str, seed: int = 0) -> dict[str, Any]:
    """One task: the buggy repository's files, the hidden tests, the report, the fix."""
    t = TEMPLATES[template]
    site = next(s for s in t.sites if s.kind == kind)
    if t.source.count(site.correct) != 1:
        raise ValueError(f"{template}/{kind}: the site must occur exactly once in the source")
    rng = random.Random(f"coderepair:{template}:{kind}:{seed}")
    pkg = f"{rng.choice(PACKAGES)}_{rng.randrange(100)}"
    path = f"{pkg}/{t.module}"
    buggy = t.source.replace(site.correct, site.buggy)
    diff = "".join(
        difflib.unified_diff(
            buggy.splitlines(keepends=True),
            t.source.splitlines(keepends=True),
            f"a/{path}",
            f"b/{path}",
        )
    )
    files = {
        f"{pkg}/__init__.py": "",
        path: buggy,
        "tests/__init__.py": "",
        f"tests/test_{t.name}.py": t.visible_tests.format(pkg=pkg),
    }
    # one or two other modules, correct, with their visible tests: a repository to find the
    # bug in, not a single file. Training tasks draw them from training templates only, so a
    # held-out template's code is never seen in training.
    split = split_of(template, kind)
    others = [o for o in TEMPLATES if o != template]
    others = [o for o in others if split != "train" or o not in HELDOUT_TEMPLATES]
    for other in rng.sample(others, min(len(others), rng.choice([1, 2]))):
        o = TEMPLATES[other]
        files[f"{pkg}/{o.module}"] = o.source
        files[f"tests/test_{o.name}.py"] = o.visible_tests.format(pkg=pkg)
    return {
        "id": f"{template}-{kind}-s{seed}",
        "template": template,
        "bug_kind": kind,
        "split": split,
        "package": pkg,
        "issue": site.issue,
        "files": files,
        "hidden_tests": {f"tests/test_{t.name}_hidden.py": t.hidden_tests.format(pkg=pkg)},
        # grading also runs the repository's visible tests, as shipped (never the agent's copy)
        "graded_visible": sorted(p for p in files if p.startswith("tests/test_")),
        "test_command": TEST_COMMAND,
        "forbidden": FORBIDDEN,
        "effect": "write",  # submit_patch is a write: the runner's write budget applies
        "buggy_file": path,
        "fix_diff": diff,
    }


def sample_tasks(n: int, *, seed: int = 0, split: str = "train") -> list[dict[str, Any]]:
    """`n` tasks of the split: its (template, kind) sites in a seeded order, cycled with new
    package names when `n` exceeds them."""
    sites = combos(split)
    random.Random(f"coderepair:{split}:{seed}").shuffle(sites)
    return [make_task(*sites[i % len(sites)], seed=seed * 1000 + i // len(sites)) for i in range(n)]


def load_task_folder(
    folder: str | Path,
    *,
    test_command: list[str],
    hidden_tests: str | Path,
    issue: str,
    task_id: str | None = None,
    forbidden: list[str] | None = None,
) -> dict[str, Any]:
    """A task from a user's repository: its text files, a test command (what `run_tests`
    runs), and a folder of hidden tests (unittest or pytest-style files, graded by
    `tracerl.envs.coderepair.grader`; a file it cannot grade is refused here, with the file
    and line)."""
    folder, hidden = Path(folder), Path(hidden_tests)
    for where, what in ((folder, "repository"), (hidden, "hidden tests")):
        if not where.is_dir():
            raise FileNotFoundError(f"load_task_folder: no {what} folder at {where}")

    def read(root: Path, prefix: str = "") -> dict[str, str]:
        out = {}
        for p in sorted(root.rglob("*")):
            if p.is_file() and ".git" not in p.parts and "__pycache__" not in p.parts:
                try:
                    out[prefix + p.relative_to(root).as_posix()] = p.read_text()
                except UnicodeDecodeError:
                    continue  # binary files are not part of a repair task
        return out

    hidden_files = read(hidden, "tests/")
    compile_suite(hidden_files)  # the grader must be able to grade them: say so now, not later
    return {
        "id": task_id or folder.resolve().name,
        "template": "user",
        "bug_kind": "unknown",
        "split": "user",
        "issue": issue,
        "files": read(folder),
        "hidden_tests": hidden_files,
        "test_command": list(test_command),
        "forbidden": forbidden if forbidden is not None else ["tests/"],
        "effect": "write",
    }
