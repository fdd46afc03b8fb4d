"""The public surface: the console script, its commands, and the re-exported API."""

from __future__ import annotations

import subprocess
import sys

from typer.testing import CliRunner

import tracerl
from tracerl.cli import app
from tracerl.jsonl import write_trajectories
from tracerl.types import Segment, Source, Trajectory


def test_version_is_importable_and_printed():
    out = subprocess.run(
        [sys.executable, "-c", "import tracerl; print(tracerl.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == tracerl.__version__
    assert CliRunner().invoke(app, ["version"]).stdout.strip() == tracerl.__version__
    flag = CliRunner().invoke(app, ["--version"])  # as other tools answer it
    assert flag.exit_code == 0 and flag.stdout.strip() == tracerl.__version__


def test_list_names_what_env_name_and_model_spec_accept():
    from tracerl.envs.registry import registered
    from tracerl.models.loading import MODEL_SPECS

    out = CliRunner().invoke(app, ["list"], env={"COLUMNS": "200"}).stdout
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert set(registered()) | set(MODEL_SPECS) | {"hf:DIR"} <= set(rows), out
    assert "Search-R1" in rows["search"]  # each environment says what it is
    assert "configs/demo.yaml" in rows  # run from the repository: its configs


def test_importing_tracerl_does_not_import_torch():
    code = "import sys, tracerl; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_help_lists_the_commands_that_exist():
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in (
        "demo",
        "show",
        "check-env",
        "replay",
        "train",
        "sft",
        "eval",
        "review",
        "report",
        "triage",
    ):
        assert command in result.stdout


def test_show_prints_a_trajectory_and_escapes_markup(tmp_path):
    seg = Segment(Source.ENVIRONMENT, (1, 2), text="[bold red]not markup[/]")
    path = tmp_path / "t.jsonl"
    write_trajectories(path, [Trajectory(segments=(seg,))])
    result = CliRunner().invoke(app, ["show", str(path)])
    assert result.exit_code == 0
    assert "[bold red]not markup[/]" in result.stdout


def test_show_reports_bad_input_without_a_traceback(tmp_path):
    result = CliRunner().invoke(app, ["show", str(tmp_path / "missing.jsonl")])
    assert result.exit_code == 2
    assert "no such trajectory file" in result.output
    assert "Traceback" not in result.output


def test_load_model_reports_unknown_specs():
    result = CliRunner().invoke(app, ["load-model", "nope"])
    assert result.exit_code == 2
    assert "valid:" in result.output


def test_public_api_is_a_short_list():
    assert set(tracerl.__all__) >= {"Trajectory", "Segment", "Source", "TrajectoryError"}
    assert tracerl.load is not None and tracerl.ChatRenderer is not None
    assert len(tracerl.__all__) < 40
    for name in tracerl.__all__:  # every advertised name resolves (lazily)
        assert getattr(tracerl, name) is not None
    assert tracerl.make("refund_desk").name == "refund_desk"


def test_readme_example_runs(tmp_path, monkeypatch):
    """The README's example is real code (run here on the tiny model to stay fast)."""
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    code = readme.split("```python\n", 1)[1].split("```", 1)[0]
    code = code.replace('"smollm2-135m-instruct"', '"tiny-random"')
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {})
    assert (tmp_path / "runs/example/episodes/step_0.jsonl.gz").is_file()
