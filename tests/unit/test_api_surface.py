"""The public names: docs/api.md lists exactly `tracerl.__all__`, each resolves, and
`tracerl.train` is callable however it was reached, without importing torch."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import tracerl

API_DOC = Path(__file__).parents[2] / "docs/api.md"


def documented_names() -> list[str]:
    """The names of docs/api.md's "Public names" list (``- `name` — one line``)."""
    section = API_DOC.read_text().split("\n## Public names\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("- ")]
    names = []
    for row in rows:
        match = re.match(r"- `([^`]+)` — \S", row)
        assert match, f"docs/api.md: {row!r} is not '- `name` — what it is'"
        names.append(match.group(1))
    return names


def test_docs_api_lists_every_public_name_once():
    names = documented_names()
    assert len(names) == len(set(names)), "a name listed twice"
    assert sorted(names) == sorted(tracerl.__all__)
    for name in names:  # each resolves (lazily)
        assert getattr(tracerl, name) is not None, name


def test_train_is_callable_before_and_after_its_modules_are_imported():
    code = """
import sys
import tracerl
assert callable(tracerl.train), type(tracerl.train)
from tracerl import train
assert train is tracerl.train
assert 'torch' not in sys.modules, 'reaching tracerl.train imported torch'
import tracerl.train.loop  # sets the package attribute to the submodule: the same module
assert callable(tracerl.train) and tracerl.train is train
assert tracerl.train.loop.train is not train  # the loop's own function stays where it was
assert issubclass(tracerl.Run, tracerl.train.run.Run)
print('ok')
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_importing_tracerl_or_reaching_train_does_not_import_torch():
    code = "import sys, tracerl; tracerl.train; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_calling_train_reaches_the_api(monkeypatch):
    """``tracerl.train(...)`` is `tracerl.train.api.train(...)`: every argument passed."""
    from tracerl.train import api

    seen = []
    monkeypatch.setattr(api, "train", lambda *a, **k: seen.append((a, k)) or "result")
    assert tracerl.train("x.yaml", env="arithmetic", trainer={"steps": 1}) == "result"
    assert seen == [(("x.yaml",), {"env": "arithmetic", "trainer": {"steps": 1}})]
