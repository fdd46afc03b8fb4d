"""The grader compiles test files into probes (calls, no expected values) and checks, runs
the probes in the sandbox, and decides outside it. Unittest and pytest-style tests grade as
they would run; what it cannot grade faithfully is refused with the file and the line."""

from __future__ import annotations

import pytest

from tracerl.envs.coderepair.env import grade_files
from tracerl.envs.coderepair.grader import SuiteError, compile_suite
from tracerl.envs.coderepair.sandbox import Limits, write_tree
from tracerl.envs.coderepair.tasks import load_task_folder

GOOD = """
class Shelf:
    def __init__(self):
        self.items = []
    def put(self, x):
        if x is None:
            raise ValueError("nothing to put")
        self.items.append(x)
        return len(self.items)

def ratio(a, b):
    return round(a / b, 3)

def tags(s):
    return sorted(set(s.split()))
"""
BUGGY = GOOD.replace("return round(a / b, 3)", "return round(b / a, 3)").replace(
    "sorted(set(s.split()))", "s.split()"
)
UNITTEST = """import unittest
from lib.core import Shelf, ratio, tags

class TestCore(unittest.TestCase):
    def setUp(self):
        self.shelf = Shelf()

    def test_shelf(self):
        self.assertEqual(self.shelf.put("a"), 1)
        self.assertEqual(self.shelf.put("b"), 2)
        self.assertIn("b", self.shelf.items)
        self.assertRaises(ValueError, self.shelf.put, None)
        with self.assertRaisesRegex(ValueError, "nothing"):
            self.shelf.put(None)

    def test_ratio(self):
        self.assertAlmostEqual(ratio(1, 3), 0.333)
        self.assertGreater(ratio(3, 1), 2.9)
        self.assertTrue(ratio(1, 1))
"""
PYTEST = """import pytest
from lib.core import tags, ratio

def test_tags():
    assert tags("b a b") == ["a", "b"]
    assert "a" in tags("a")
    assert not tags("")

def test_ratio_by_zero():
    with pytest.raises(ZeroDivisionError):
        ratio(1, 0)
"""


def _task(tmp_path, hidden):
    repo = write_tree({"lib/__init__.py": "", "lib/core.py": BUGGY}, tmp_path / "repo")
    hid = write_tree(hidden, tmp_path / "hidden")
    return load_task_folder(
        repo, test_command=["python3", "-m", "unittest"], hidden_tests=hid, issue="ratio"
    )


def test_unittest_and_pytest_style_tests_grade_as_they_would_run(tmp_path):
    task = _task(tmp_path, {"test_unit.py": UNITTEST, "test_py.py": PYTEST})
    suite = compile_suite(task["hidden_tests"])
    assert len(suite.tests) == 4 and len(suite.checks) == 12
    buggy = grade_files(task, task["files"], Limits())
    assert not buggy["ok"] and sorted(buggy["failing"]) == [
        "tests/test_py.py::test_ratio_by_zero",  # b / a: 0 / 1 raises nothing
        "tests/test_py.py::test_tags",
        "tests/test_unit.py::TestCore::test_ratio",
    ]
    assert buggy["failures"] == 3  # assertions that do not hold, not errors
    fixed = grade_files(task, {**task["files"], "lib/core.py": GOOD}, Limits())
    assert fixed["ok"] and fixed["ran"] == 4 and fixed["failures"] == fixed["errors"] == 0


def test_a_test_that_errors_outside_an_assertion_is_an_error_not_a_pass(tmp_path):
    task = _task(
        tmp_path,
        {
            "test_e.py": "from lib.core import ratio\n\ndef test_e():\n"
            "    ratio(1, 0)\n    assert ratio(1, 2) == 0.5\n"
        },
    )
    verdict = grade_files(task, {**task["files"], "lib/core.py": GOOD}, Limits())
    assert verdict["errors"] == 1 and not verdict["ok"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("    for x in [1, 2]:\n        assert x > 0\n", "inside a loop"),
        ("    if True:\n        assert 1 == 1\n", "inside a loop, condition"),
        ("    self.assertIsInstance(1, int)\n", "assertIsInstance is not supported"),
        ("    with self.assertRaises(ValueError) as cm:\n        int('x')\n", "without `as`"),
        ("    def check(v):\n        assert v\n    check(1)\n", "nested function"),
        ("    int('1')\n", "asserts nothing"),
    ],
)
def test_what_cannot_be_graded_faithfully_is_refused_with_file_and_line(body, message):
    src = f"import unittest\n\nclass TestX(unittest.TestCase):\n  def test_x(self):\n{body}"
    src = src.replace("\n    ", "\n      ").replace("\n  def", "\n    def")
    with pytest.raises(SuiteError, match=rf"tests/test_x.py:\d+: .*{message}"):
        compile_suite({"tests/test_x.py": src})


def test_assertions_in_helpers_are_refused_they_would_be_decided_in_the_sandbox():
    helper = "def check(v):\n    assert v == 1\n\ndef test_x():\n    assert check(1) is None\n"
    with pytest.raises(SuiteError, match=r"test_h\.py:2: .*check \(outside a test\)"):
        compile_suite({"tests/test_h.py": helper})


def test_a_user_task_with_hidden_tests_the_grader_cannot_grade_is_refused_at_load(tmp_path):
    bad = "def test_x():\n    for i in range(3):\n        assert i < 3\n"
    with pytest.raises(SuiteError, match=r"tests/test_bad\.py:2: an assertion inside a loop"):
        _task(tmp_path, {"test_bad.py": bad})
