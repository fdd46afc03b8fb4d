"""Code-repair tasks: every seeded bug is caught by the hidden tests, the known fix passes
them, and held-out tasks are new (a template or a bug kind training never sees)."""

from __future__ import annotations

import pytest

from tracerl.envs.coderepair.env import grade_files, graded_tests
from tracerl.envs.coderepair.grader import compile_suite
from tracerl.envs.coderepair.sandbox import Limits, run_sandboxed, write_tree
from tracerl.envs.coderepair.tasks import combos, load_task_folder, make_task, sample_tasks
from tracerl.envs.coderepair.templates import BUG_KINDS, TEMPLATES

SITES = [(t, k) for t in TEMPLATES for k in BUG_KINDS]


def _tests(task, tmp_path, *, fixed: bool, hidden: bool):
    files = dict(task["files"])
    if fixed:
        files[task["buggy_file"]] = TEMPLATES[task["template"]].source
    if hidden:
        files.update(task["hidden_tests"])
    root = write_tree(files, tmp_path / ("fixed" if fixed else "buggy"))
    return run_sandboxed(root, task["test_command"])


@pytest.mark.parametrize(("template", "kind"), SITES)
def test_the_hidden_tests_catch_the_bug_and_pass_the_fix(template, kind, tmp_path):
    task = make_task(template, kind, seed=1)
    buggy = _tests(task, tmp_path, fixed=False, hidden=True)
    assert buggy.status == "failed", buggy.output[-500:]
    fixed = _tests(task, tmp_path, fixed=True, hidden=True)
    assert fixed.status == "ok", fixed.output[-500:]
    assert "Ran " in fixed.output  # the tests really ran
    # the grader (observations in the sandbox, verdict outside) agrees with unittest
    files = dict(task["files"])
    assert not grade_files(task, files, Limits())["ok"]
    files[task["buggy_file"]] = TEMPLATES[task["template"]].source
    verdict = grade_files(task, files, Limits())
    hidden = compile_suite(task["hidden_tests"]).tests
    assert verdict["ok"] and verdict["ran"] == len(hidden) and verdict["visible_failing"] == []
    assert len(compile_suite(graded_tests(task)).tests) > len(hidden)  # visible ones graded too


def test_the_fix_diff_turns_the_buggy_file_into_the_correct_one():
    task = make_task("stats", "off_by_one", seed=0)
    diff = task["fix_diff"]
    assert diff.startswith(f"--- a/{task['buggy_file']}")
    assert "-    return [sum(xs[i:i + k]) for i in range(len(xs) - k)]" in diff
    assert "+    return [sum(xs[i:i + k]) for i in range(len(xs) - k + 1)]" in diff


def test_tasks_are_deterministic_and_seeds_rename_the_package():
    assert make_task("text", "wrong_default", 3) == make_task("text", "wrong_default", 3)
    names = {make_task("text", "wrong_default", s)["package"] for s in range(6)}
    assert len(names) > 1
    task = make_task("text", "wrong_default", 3)
    pkg = task["package"]
    assert f"from {pkg}.text import" in task["files"]["tests/test_text.py"]


def test_held_out_tasks_are_new_templates_or_new_bug_kinds():
    train, heldout = combos("train"), combos("heldout")
    assert train and heldout and not set(train) & set(heldout)
    seen_templates = {t for t, _ in train}
    seen_kinds = {k for _, k in train}
    assert all(t not in seen_templates or k not in seen_kinds for t, k in heldout)
    tasks = sample_tasks(20, seed=0, split="heldout")
    assert len(tasks) == 20 and len({t["id"] for t in tasks}) == 20
    assert all(t["split"] == "heldout" for t in tasks)
    with pytest.raises(ValueError, match="unknown code-repair split"):
        combos("validation")


def test_a_repository_has_correct_distractor_modules_and_training_never_sees_held_out_code():
    for seed in range(6):
        task = make_task("stats", "off_by_one", seed)
        modules = [p for p in task["files"] if p.endswith(".py") and not p.startswith("tests/")]
        assert len(modules) >= 3  # __init__, the buggy module, at least one other
        assert not any("inventory" in p for p in task["files"])  # a held-out template
    held = make_task("inventory", "off_by_one", 0)
    assert any(p.endswith("stats.py") or p.endswith("text.py") for p in held["files"])


def test_a_user_repository_becomes_a_task(tmp_path):
    repo = tmp_path / "repo"
    write_tree({"lib/m.py": "X = 1\n", "tests/test_m.py": "import unittest\n"}, repo)
    hidden = write_tree({"test_m_hidden.py": "import unittest\n"}, tmp_path / "hidden")
    task = load_task_folder(
        repo, test_command=["python3", "-m", "unittest"], hidden_tests=hidden, issue="X is 1"
    )
    assert set(task["files"]) == {"lib/m.py", "tests/test_m.py"}
    assert set(task["hidden_tests"]) == {"tests/test_m_hidden.py"}
    with pytest.raises(FileNotFoundError, match="no hidden tests folder"):
        load_task_folder(repo, test_command=["true"], hidden_tests=tmp_path / "nope", issue="")
    with pytest.raises(ValueError, match="outside the tree"):
        write_tree({"../escape.py": ""}, tmp_path / "t")
