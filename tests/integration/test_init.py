"""`tracerl init NAME`, as a user runs it: the starter project passes check-env, trains with
the environment's own verifier, and its own tests pass; init never overwrites and refuses a
bad name in one line with exit status 2. Everything runs the real `tracerl` command."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

TRACERL = shutil.which("tracerl", path=str(Path(sys.executable).parent)) or "tracerl"
FAST = [  # the starter's config, cut to a smoke test
    "model.spec=tiny-random",
    "warm_start=null",
    "trainer.steps=2",
    "trainer.group_size=2",
    "env.tasks_per_step=2",
    "env.eval_tasks=2",
    "rollout.max_turn_tokens=16",
]


def _run(cwd: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    # TRACERL_CACHE (tests/conftest.py) reaches the command through the environment
    return subprocess.run(
        list(args), cwd=cwd, capture_output=True, text=True, timeout=timeout, env=os.environ
    )


def _tracerl(cwd: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return _run(cwd, TRACERL, *args, timeout=timeout)


def test_the_starter_project_checks_trains_and_passes_its_tests(tmp_path):
    made = _tracerl(tmp_path, "init", "unitconv")
    assert made.returncode == 0, made.stdout + made.stderr
    project = tmp_path / "unitconv"
    assert "tracerl check-env unitconv.env:UnitConv" in made.stdout
    for path in [
        "pyproject.toml",
        "README.md",
        "unitconv/__init__.py",
        "unitconv/env.py",
        "unitconv/rewards.py",
        "configs/unitconv.yaml",
        "tests/test_unitconv.py",
    ]:
        assert (project / path).is_file(), path
        assert "{{" not in (project / path).read_text(), f"{path}: a template left unrendered"
    assert '"tracerl.envs"' in (project / "pyproject.toml").read_text()

    checked = _tracerl(project, "check-env", "unitconv.env:UnitConv")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "FAIL" not in checked.stdout

    trained = _tracerl(project, "train", "configs/unitconv.yaml", *FAST)
    assert trained.returncode == 0, trained.stdout + trained.stderr
    run = project / "runs" / "unitconv"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if r["phase"] == "train"]
    assert len(train_rows) == 2
    # no reward was configured: the episodes were scored by the env's own verifier, which
    # the breakdown names (besides the attribution label), and so does the dashboard
    components = {k.removeprefix("train/reward/") for k in train_rows[0] if "/reward/" in k}
    (own,) = components - {"attribution"}
    assert "unitconv" in own
    assert own in (run / "report" / "index.html").read_text()

    tested = _run(project, sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider")
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert " passed" in tested.stdout and "failed" not in tested.stdout


def test_init_never_overwrites_and_refuses_bad_names(tmp_path):
    mine = tmp_path / "unitconv"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    again = _tracerl(tmp_path, "init", "unitconv", timeout=300)
    assert again.returncode == 2
    assert again.stderr.strip().count("\n") == 0 and "already exists" in again.stderr
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]

    for bad, why in [
        ("Unit-Conv", "lowercase"),
        ("class", "keyword"),
        ("json", "standard library"),
        ("tracerl", "reserved"),
    ]:
        out = _tracerl(tmp_path, "init", bad, timeout=300)
        assert out.returncode == 2, (bad, out.stdout, out.stderr)
        assert out.stderr.startswith("error: ") and why in out.stderr, out.stderr
        assert out.stderr.strip().count("\n") == 0, out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["unitconv"]  # nothing else made
