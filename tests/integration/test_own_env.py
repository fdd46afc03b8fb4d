"""A user's own environment and verifier, from their own package, through the real command.

Two ways in: installed (entry points ``tracerl.envs`` / ``tracerl.rewards``) and by import
path (``env.name: module:Class``, ``trainer.reward: module:function``, found in the working
directory). Each runs check-env, a two-step training run on the tiny model, report, show,
triage and a live replay, and the run is described in the verifier's own terms.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.ownpkg import TINY_RUN, tracerl, write_package


def _ok(result) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def _episode_ids(run: Path) -> list[str]:
    import gzip

    ids = []
    for f in sorted((run / "episodes").glob("*.jsonl.gz")):
        with gzip.open(f, "rt") as fh:
            ids += [json.loads(line)["receipt"]["episode_id"] for line in fh if line.strip()]
    return ids


def _use_the_run(cwd: Path, run: Path, pythonpath: Path | None, component: str) -> None:
    """report, show, triage and replay --live on the run, as a user would."""
    report = _ok(tracerl("report", str(run), cwd=cwd, pythonpath=pythonpath))
    page = Path(report.split("report:", 1)[1].strip())
    html = page.read_text()
    assert component in html  # the verifier's own component, in the reward table
    assert "citation" not in html.lower()  # never the search reward's words
    ids = _episode_ids(run)
    assert ids
    triage = _ok(tracerl("triage", str(run), cwd=cwd, pythonpath=pythonpath))
    assert any(i in triage for i in ids)  # ids offered whole, ready to copy
    assert "answered_without_evidence" not in triage  # the search reward's terms
    shown = _ok(tracerl("show", str(run), ids[0], cwd=cwd, pythonpath=pythonpath))
    assert component in shown and "Convert" in shown  # the question row of a custom env
    live = _ok(
        tracerl("replay", str(run), "--episode", ids[0], "--live", cwd=cwd, pythonpath=pythonpath)
    )
    assert "no drift" in live


def _write_config(folder: Path, runs: Path, name: str, env: str, reward: str) -> Path:
    config = folder / "unit.yaml"
    data = {"name": name, "out_dir": str(runs), "env": {"name": env}}
    config.write_text(yaml.safe_dump({**data, "trainer": {"reward": reward}}))
    return config


def _receipt_env(run: Path) -> dict:
    import gzip

    f = sorted((run / "episodes").glob("*.jsonl.gz"))[0]
    with gzip.open(f, "rt") as fh:
        return json.loads(fh.readline())["receipt"]["env"]


@pytest.mark.timeout(900)
def test_an_installed_package_declares_its_env_and_reward_by_entry_point(tmp_path):
    site = write_package(tmp_path)
    work = tmp_path / "work"  # not the package's folder: only the entry points can find it
    work.mkdir()
    checked = _ok(tracerl("check-env", "unitconv", cwd=work, pythonpath=site))
    assert "splits: train, test" in checked and "FAIL" not in checked
    config = _write_config(work, tmp_path / "runs", "unit-ep", "unitconv", "unit_tolerance")
    resolved = _ok(
        tracerl("train", str(config), *TINY_RUN, "--print-config", cwd=work, pythonpath=site)
    )
    assert yaml.safe_load(resolved)["env"]["eval_split"] == "test"  # the env's, not "heldout"
    _ok(tracerl("train", str(config), *TINY_RUN, cwd=work, pythonpath=site))
    run = tmp_path / "runs" / "unit-ep"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r.get("phase") == "train"] == [0, 1]
    assert any("eval/test/success_rate" in r for r in rows)
    assert _receipt_env(run)["import"] == "unitpkg.envs:UnitConv"
    _use_the_run(work, run, site, "within_tolerance")


@pytest.mark.timeout(900)
def test_an_env_and_a_reward_by_import_path_from_the_working_directory(tmp_path):
    site = write_package(tmp_path, dist_info=False)  # not installed at all
    env, reward = "unitpkg.envs:UnitConv", "unitpkg.rewards:within_tolerance"
    config = _write_config(site, tmp_path / "runs", "unit-path", env, reward)
    checked = _ok(tracerl("check-env", "unitpkg.envs:UnitConv", cwd=site))
    assert "FAIL" not in checked
    _ok(tracerl("train", str(config), *TINY_RUN, cwd=site))
    run = tmp_path / "runs" / "unit-path"
    assert _receipt_env(run)["import"] == "unitpkg.envs:UnitConv"
    _use_the_run(site, run, None, "within_tolerance")
    ready = _ok(tracerl("readiness", str(config), *TINY_RUN, "--episodes", "4", "--json", cwd=site))
    assert json.loads(ready)["config"]["env"] == "unitpkg.envs:UnitConv"
    evaluated = tmp_path / "runs" / "unit-eval"
    _ok(tracerl("eval", str(config), *TINY_RUN, "--out", str(evaluated), "--n", "3", cwd=site))
    rows = [json.loads(x) for x in (evaluated / "metrics.jsonl").read_text().splitlines()]
    assert any("eval/test/success_rate" in r for r in rows)  # the env's split, its reward
    assert len(_episode_ids(evaluated / "eval")) == 3
