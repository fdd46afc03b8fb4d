"""`coderepair`: fix a bug in a small repository with four tools, graded by hidden tests.

    search_files(pattern)          regex over the work tree: path:line: text (read)
    read_file(path, start, end)    numbered lines (read)
    run_tests(selector)            the visible tests (or those matching) in the sandbox (read)
    submit_patch(unified_diff)     applied in the sandbox to the episode's scratch copy (write)

The final answer ends the episode; the hidden acceptance tests then run on the scratch copy
(in the sandbox) and the step's info carries the verdict, which is computed outside the
sandbox from observations, never read from the tested process (`grader`). Nothing ever
touches a task's source: the work tree is a per-episode copy, and a patch's real write (a
user's repository on disk, `allow_real_writes` with the guard off) is the only way out.

Evidence gain: the first read of the lines the bug is on (0.5), and a test run whose failing
set differs from the previous run's (0.5); re-reading the same lines or re-running unchanged
tests gains nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from typing import Any

from tracerl.envs.base import Message, StepResult, ToolEnv
from tracerl.envs.coderepair.grader import compile_suite
from tracerl.envs.coderepair.reward import CODE_REPAIR_REWARD
from tracerl.envs.coderepair.sandbox import Limits, RunResult, run_files, write_tree
from tracerl.envs.coderepair.tasks import SPLITS
from tracerl.envs.coderepair.tasks import sample_tasks as _sample
from tracerl.envs.coderepair.verdict import grade, new_nonce
from tracerl.envs.parsers import Action
from tracerl.envs.tools import InfraError, PolicyError, ToolResult, tool
from tracerl.types import FaultKind, ToolCall

LOG_CHARS = 2000
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? ", re.M)
_TIMING = re.compile(r" in \d+\.\d+s")
_DUMP = (
    "import json, pathlib\n"
    "print(json.dumps({p.as_posix(): p.read_text() for p in sorted(pathlib.Path('.').rglob('*'))"
    " if p.is_file() and p.name != '.patch.diff' and '__pycache__' not in p.parts}))\n"
)


def _bug_lines(task: dict[str, Any]) -> set[int]:
    m = _HUNK.search(task.get("fix_diff", ""))
    if m is None:
        return set()
    start, count = int(m.group(1)), int(m.group(2) or 1)
    return set(range(start, start + max(1, count)))


def test_summary(r: RunResult) -> dict[str, Any]:
    """What a unittest run reported: ran, failures, errors, ok (and the limit that cut it)."""
    if r.status == "sandbox_error":
        raise InfraError(f"the sandbox failed: {r.detail or r.output[:200]}", retryable=True)
    ran = re.search(r"^Ran (\d+) tests?", r.output, re.M)
    fails = re.search(r"failures=(\d+)", r.output)
    errors = re.search(r"errors=(\d+)", r.output)
    failing = sorted(set(re.findall(r"^(?:FAIL|ERROR): (\S+ \(\S+\))", r.output, re.M)))
    return {
        "ran": int(ran.group(1)) if ran else 0,
        "failures": int(fails.group(1)) if fails else 0,
        "errors": int(errors.group(1)) if errors else (0 if ran else 1),
        "ok": r.status == "ok" and ran is not None,
        "limit": r.limit,
        "failing": failing,
    }


class CodeRepair(ToolEnv):
    name = "coderepair"
    version = "0.1"
    splits = SPLITS
    reward_components = CODE_REPAIR_REWARD

    def __init__(self, *, side_effect_guard: str = "dry_run", limits: Limits | None = None):
        super().__init__(side_effect_guard=side_effect_guard)
        self.limits = limits or Limits()
        self.files: dict[str, str] = {}
        self.written: list[str] = []  # real writes: paths patched in a task's source folder

    # ---- the sandbox -----------------------------------------------------------------------
    def _run(self, files: dict[str, str], argv: list[str], limits: Limits | None = None):
        return run_files(files, argv, limits or self.limits)

    # ---- tools -----------------------------------------------------------------------------
    @tool(effect="read", timeout_s=10.0, version="1")
    def search_files(self, pattern: str) -> Any:
        """Search the repository's files with a regular expression.

        Args:
            pattern: a Python regular expression, matched against each line.
        """
        try:
            rx = re.compile(pattern)
        except re.error as e:
            raise PolicyError(f"bad pattern {pattern!r}: {e}", FaultKind.INVALID_ARGUMENTS) from e
        hits = [
            f"{path}:{i}: {line.strip()}"
            for path, text in sorted(self.files.items())
            for i, line in enumerate(text.splitlines(), 1)
            if rx.search(line)
        ]
        shown = hits[:50] + ([f"... {len(hits) - 50} more"] if len(hits) > 50 else [])
        return ToolResult("\n".join(shown) or "no match", evidence={"gain": 0.0})

    @tool(effect="read", timeout_s=10.0, version="1")
    def read_file(self, path: str, start: int = 1, end: int = 0) -> Any:
        """Read a file's lines, numbered.

        Args:
            path: the file's path in the repository, e.g. "pkg/module.py".
            start: the first line to show (1-based).
            end: the last line to show (0: to the end of the file).
        """
        path = path.strip().removeprefix("./")
        text = self.files.get(path)
        if text is None:
            raise PolicyError(
                f"no file {path!r}; search_files lists paths", FaultKind.INVALID_ARGUMENTS
            )
        lines = text.splitlines()
        last = len(lines) if end <= 0 else min(end, len(lines))
        shown = range(max(1, start), last + 1)
        gain = 0.0
        if path == self.task.get("buggy_file"):
            new = self._bug_lines & set(shown) - self._read_lines
            gain = 0.5 if new and not self._bug_lines & self._read_lines else 0.0
            self._read_lines |= set(shown)
        body = "\n".join(f"{i:4d}  {lines[i - 1]}" for i in shown)
        return ToolResult(body or "(no lines in that range)", evidence={"gain": gain})

    @tool(effect="read", timeout_s=60.0, version="1")
    def run_tests(self, selector: str = "") -> Any:
        """Run the repository's visible tests in a sandbox.

        Args:
            selector: only the tests whose name contains it (e.g. "test_clamp"); empty: all.
        """
        argv = list(self.task["test_command"])
        if selector.strip():
            if not re.fullmatch(r"[\w.]+", selector.strip()):
                raise PolicyError(f"bad selector {selector!r}", FaultKind.INVALID_ARGUMENTS)
            argv += ["-k", selector.strip()]
        r = self._run(self.files, argv)
        s = test_summary(r)
        self.tests_run += 1
        failing = tuple(s["failing"]) if s["ran"] else ("<no result>",)
        gain = 0.5 if self._last_failing is not None and failing != self._last_failing else 0.0
        if self._last_failing is None and s["failures"] + s["errors"]:
            gain = 0.5  # the first run that shows the bug
        self._last_failing = failing
        head = (
            f"TIMEOUT: the tests did not finish ({s['limit']} limit); no result"
            if s["limit"]
            else f"ran {s['ran']}: {s['failures']} failures, {s['errors']} errors"
            + (" - OK" if s["ok"] else "")
        )
        log = _TIMING.sub("", r.output)[-LOG_CHARS:]
        return ToolResult(f"{head}\n{log}", evidence={"gain": gain, "tests": s})

    @tool(effect="write", timeout_s=60.0, version="1")
    def submit_patch(self, unified_diff: str, dry_run: bool = False) -> Any:
        """Apply a patch (unified diff, paths like a/pkg/module.py and b/pkg/module.py).

        Args:
            unified_diff: the patch, as `diff -u` or `git diff` writes it.
        """
        if not re.search(r"^\+\+\+ ", unified_diff, re.M):
            raise PolicyError(
                "no file in the patch (expected --- a/<path> and +++ b/<path> lines)",
                FaultKind.INVALID_ARGUMENTS,
            )
        files = {**self.files, ".patch.diff": unified_diff}
        argv = [
            "/bin/sh",
            "-c",
            "patch -p1 --batch --forward --no-backup-if-mismatch -s < .patch.diff"
            ' && python3 -I -c "$1"',  # -I: a json.py or pathlib.py the patch plants is not used
            "sh",
            _DUMP,
        ]
        r = self._run(files, argv, Limits(wall_s=20.0, output_bytes=4_000_000))
        if r.status == "sandbox_error":
            raise InfraError(f"the sandbox failed: {r.detail}", retryable=True)
        if r.status != "ok":
            self.patches_failed += 1
            return ToolResult(
                f"the patch does not apply:\n{r.output[-LOG_CHARS:]}", evidence={"gain": 0.0}
            )
        after = _read_dump(r.output)
        if after is None:  # the tree could not be read back (e.g. a file that is not text)
            self.patches_failed += 1
            return ToolResult(
                "the patch does not apply: the patched files could not be read back as text",
                evidence={"gain": 0.0},
            )
        before, self.files = self.files, after
        # what the patch really changed, added or deleted (whatever its headers claim)
        touched = sorted(p for p in {*before, *self.files} if before.get(p) != self.files.get(p))
        forbidden = [p for p in touched if _forbidden(p, self.task.get("forbidden", []))]
        self.forbidden_touched |= set(forbidden)
        self.patches_applied += 1
        effect = {"patch": {"files": touched, "forbidden": forbidden, "dry_run": dry_run}}
        if not dry_run and self.task.get("source_dir"):
            # a forbidden path (the tests, version-control metadata: a .git/config or hook
            # would run commands on the host) is reported, never written for real
            real = {p: self.files[p] for p in touched if p in self.files and p not in forbidden}
            write_tree(real, self.task["source_dir"])
            self.written += sorted(real)
        what = ", ".join(touched) or "nothing (the patch changed no file)"
        return ToolResult(f"patch applied to {what}", evidence={"gain": 0.0}, effect=effect)

    # ---- episode -------------------------------------------------------------------------
    async def setup(self, task: dict[str, Any], seed: int) -> list[Message]:
        self.files = dict(task["files"])
        self._bug_lines, self._read_lines = _bug_lines(task), set()
        self._last_failing: tuple[str, ...] | None = None
        self.tests_run = self.patches_applied = self.patches_failed = 0
        self.forbidden_touched: set[str] = set()
        listing = "\n".join(sorted(self.files))
        return [
            {
                "role": "system",
                "content": "You fix bugs in a Python repository. Find the bug with the tools, "
                "submit a patch that fixes the code (never edit the tests), run the tests, then "
                "give a short final answer.",
            },
            {"role": "user", "content": f"Bug report: {task['issue']}\n\nFiles:\n{listing}"},
        ]

    async def finish(self, action: Action) -> StepResult:
        self.done = True
        hidden = await asyncio.to_thread(self.grade)
        info = {
            "answer": {"text": action.answer or "", "citations": []},
            "hidden_tests": hidden,
            "forbidden_touched": sorted(self.forbidden_touched),
            "patches_applied": self.patches_applied,
            "patches_failed": self.patches_failed,
            "tests_run": self.tests_run,
        }
        return StepResult([], terminated=True, info=info)

    def grade(self) -> dict[str, Any]:
        """The hidden tests (and the task's own visible tests, as the task shipped them) on
        the scratch copy, graded outside the sandbox (`tracerl.envs.coderepair.grader`):
        the tested code sees the calls, never an expected value, and cannot decide its
        grade."""
        return grade_files(self.task, self.files, self.limits)

    def snapshot(self) -> Any:
        """Real state: the files written to a task's source folder (a dry run writes none)."""
        return list(self.written)

    def sample_tasks(self, n: int, *, seed: int = 0, split: str = "train") -> list[dict[str, Any]]:
        return _sample(n, seed=seed, split=split)

    def check_script(self, task: dict[str, Any]) -> list[Action]:
        return oracle_actions(task)


VCS_DIRS = {".git", ".hg", ".svn"}
"""Version-control metadata: forbidden in every task (hooks and config run host commands)."""


def _forbidden(path: str, prefixes: list[str]) -> bool:
    return any(path.startswith(f) for f in prefixes) or bool(VCS_DIRS & set(path.split("/")))


def _read_dump(output: str) -> dict[str, str] | None:
    """The patched tree as the dump printed it: {path: text}, or None if it is not that."""
    try:
        files = json.loads(output[output.index("{") :])
    except ValueError:
        return None
    if not isinstance(files, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in files.items()
    ):
        return None
    return files


def graded_tests(task: dict[str, Any]) -> dict[str, str]:
    """What grades a repair: the hidden tests, and the visible tests the task lists in
    ``graded_visible`` as the task shipped them (the agent's copies are not trusted)."""
    visible = {p: task["files"][p] for p in task.get("graded_visible", [])}
    return {**visible, **task.get("hidden_tests", {})}


def grade_files(task: dict[str, Any], files: dict[str, str], limits: Limits) -> dict[str, Any]:
    """Run the compiled probes on `files` in the sandbox and grade their observations."""
    suite = compile_suite(graded_tests(task))
    nonce = new_nonce()
    argv = ["python3", "-I", "/grade/harness.py", nonce]
    grading = dataclasses.replace(limits, output_bytes=max(limits.output_bytes, 1_000_000))
    r = run_files(files, argv, grading, grade=suite.sandbox_files())
    if r.status == "sandbox_error":
        raise InfraError(f"the sandbox failed: {r.detail or r.output[:200]}", retryable=True)
    return grade(suite, r.output, nonce, r.limit, counted=set(task.get("hidden_tests", {})))


def oracle_actions(task: dict[str, Any]) -> list[Action]:
    """The scripted oracle: read the buggy file, apply the known fix, run the tests, answer."""
    calls = [
        [ToolCall("call_0_0", "read_file", {"path": task["buggy_file"]})],
        [ToolCall("call_1_0", "submit_patch", {"unified_diff": task["fix_diff"]})],
        [ToolCall("call_2_0", "run_tests", {})],
    ]
    return [Action(text="", tool_calls=tuple(c)) for c in calls] + [
        Action(text="Fixed.", answer="Fixed the bug.")
    ]
