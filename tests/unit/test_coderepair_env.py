"""The code-repair environment: it passes check_env, the scripted oracle fixes the held-out
tasks and a do-nothing agent fixes none, evidence gain rewards new information only, and
editing the tests, looping forever or a timeout are visible for what they are."""

from __future__ import annotations

import asyncio
import copy

from tracerl.envs import make
from tracerl.envs.coderepair.env import oracle_actions
from tracerl.envs.coderepair.tasks import make_task
from tracerl.envs.parsers import Action
from tracerl.rollout.env_check import check_env
from tracerl.types import ToolCall

ANSWER = Action(text="done", answer="done")


def _call(name, **args):
    return Action(text="", tool_calls=(ToolCall("c0", name, args),))


async def _play(task, actions):
    env = make("coderepair")
    await env.reset(task, 0)
    results = []
    for a in actions:
        r = await env.step(a)
        results.append(r)
        if r.terminated:
            break
    return env, results


def play(task, actions):
    return asyncio.run(_play(task, actions))[1]


def test_check_env_passes():
    assert check_env("coderepair", raise_on_failure=False).ok


def test_the_oracle_fixes_held_out_tasks_and_doing_nothing_fixes_none():
    tasks = make("coderepair").sample_tasks(20, seed=0, split="heldout")
    fixed = nothing = 0
    for task in tasks:
        results = play(task, oracle_actions(task))
        fixed += results[-1].info["hidden_tests"]["ok"]
        results = play(task, [ANSWER])
        nothing += results[-1].info["hidden_tests"]["ok"]
    assert fixed >= 19 and nothing == 0, (fixed, nothing)


def test_evidence_gain_counts_new_information_only():
    task = make_task("stats", "off_by_one", seed=0)
    path = task["buggy_file"]
    r = play(
        task,
        [
            _call("read_file", path=path, start=1, end=3),  # not the bug's lines
            _call("read_file", path=path),  # the bug's lines: new
            _call("read_file", path=path),  # the same again: nothing new
            _call("run_tests"),  # visible tests pass here: nothing shown yet
            _call("submit_patch", unified_diff=task["fix_diff"]),
            _call("run_tests"),  # same outcome as before: nothing new
        ],
    )
    assert [x.evidence_gain for x in r] == [0.0, 0.5, 0.0, 0.0, 0.0, 0.0]
    task = make_task("stats", "swapped_arguments", seed=0)  # a visible test fails here
    fix = _call("submit_patch", unified_diff=task["fix_diff"])
    r = play(task, [_call("run_tests"), fix, _call("run_tests")])
    assert [x.evidence_gain for x in r] == [0.5, 0.0, 0.5]  # the failure, then its fix


def test_a_patch_never_touches_the_task_and_editing_tests_is_recorded():
    task = make_task("stats", "swapped_arguments", seed=0)
    original = copy.deepcopy(task)
    test_file = next(p for p in task["files"] if p.startswith("tests/test_"))
    lines = task["files"][test_file].splitlines(keepends=True)
    # the hack: delete the failing visible test instead of fixing the code
    cut = next(i for i, line in enumerate(lines) if "def test_clamp" in line)
    removed = lines[cut : cut + 3]
    diff = f"--- a/{test_file}\n+++ b/{test_file}\n@@ -{cut + 1},3 +{cut},0 @@\n" + "".join(
        "-" + line for line in removed
    )
    r = play(task, [_call("submit_patch", unified_diff=diff), _call("run_tests"), ANSWER])
    assert r[0].calls[0].result.effect["patch"]["forbidden"] == [test_file]
    assert "0 failures, 0 errors" in r[1].messages[0]["content"]  # the visible tests "pass"
    info = r[-1].info
    assert info["forbidden_touched"] == [test_file] and not info["hidden_tests"]["ok"]
    assert task == original  # the task's files are never changed


def test_code_that_hangs_is_a_timeout_never_no_problem():
    task = make_task("stats", "off_by_one", seed=0)
    path = task["buggy_file"]
    diff = (
        f"--- a/{path}\n+++ b/{path}\n@@ -1,1 +1,3 @@\n"
        ' """Small statistics helpers."""\n+while True:\n+    pass\n'
    )
    env = make("coderepair", limits=None)
    env.limits = env.limits.__class__(cpu_s=2, wall_s=5.0)

    async def go():
        await env.reset(task, 0)
        patched = await env.step(_call("submit_patch", unified_diff=diff))
        tested = await env.step(_call("run_tests"))
        return patched, tested

    patched, tested = asyncio.run(go())
    assert patched.calls[0].result.ok
    text = tested.messages[0]["content"]
    assert text.startswith("TIMEOUT") and "no result" in text
    assert tested.calls[0].result.error is None  # the policy's code, not an outage


def test_bad_tool_input_is_the_policys_mistake():
    task = make_task("text", "wrong_default", seed=0)
    r = play(
        task,
        [
            _call("read_file", path="nope.py"),
            _call("search_files", pattern="("),
            _call("submit_patch", unified_diff="not a diff"),
        ],
    )
    for x in r:
        err = x.calls[0].result.error
        assert err is not None and err.kind.value == "invalid_arguments"
