"""`tracerl export`: a run's trained policy leaves as a Hugging Face folder that `hf:` loads
and that gives the run's own log-probs; checkpoint retention (`trainer.keep_last`); an
export never overwrites a folder and names the checkpoints there are. (vLLM loading the
exported folder: tests/integration/test_vllm_engine.py.)"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from typer.testing import CliRunner

from tracerl.cli import app
from tracerl.config.loading import load_config
from tracerl.envs.parsers import parser_for_model
from tracerl.models import load
from tracerl.rollout.persist import read_step_file
from tracerl.train.logprobs import token_logprobs
from tracerl.train.loop import train

ARGS = [
    "trainer.steps=3",
    "trainer.group_size=16",
    "env.tasks_per_step=2",
    "env.eval_tasks=6",
    "trainer.checkpoint_every=1",
    "trainer.keep_last=2",
    "trainer.lr=1e-2",
    "rollout.max_turn_tokens=6",
]


def _gap_on_final_evaluation(run, model, temperature: float) -> float:
    """The largest difference between `model`'s log-probs and those the run recorded for
    its policy tokens in the evaluation after its last step (sampled by its final policy)."""
    (final,) = sorted((run / "eval" / "episodes").glob("step_3.jsonl*"))
    gap = 0.0
    for t in read_step_file(final):
        ids = [i for s in t.segments for i in s.token_ids]
        recorded = [(n, lp) for n, lp in _policy_positions(t)]
        x = torch.tensor([ids])
        with torch.no_grad():
            lps = token_logprobs(model, x, torch.ones_like(x), temperature=temperature)[0]
        gap = max([gap, *(abs(float(lps[n]) - lp) for n, lp in recorded)])
    return gap


def _policy_positions(t):
    n = 0
    for s in t.segments:
        if s.source.value == "policy":
            for i, lp in enumerate(s.logprobs):
                yield n + i, lp
        n += len(s.token_ids)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_export_round_trips_the_final_policy_and_keeps_what_it_should(tmp_path, lora):
    extra = ["model.lora={r: 4, alpha: 8}"] if lora else []
    cfg = load_config("configs/learn-arithmetic.yaml", [f"out_dir={tmp_path}", *ARGS, *extra])
    train(cfg, log=lambda _: None)
    run = cfg.run_dir
    # trainer.keep_last: the newest two checkpoints, the older ones deleted
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_1", "step_2"]

    out = tmp_path / "exported"
    r = CliRunner().invoke(app, ["export", str(run), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert f"hf:{out}" in r.stdout
    receipt = json.loads((out / "tracerl_export.json").read_text())
    assert receipt["step"] == 2 and receipt["lora_merged"] is lora
    assert receipt["base_model"] == "tiny-chars"
    assert receipt["parser"] == "json_list"  # the format the run trained it on
    # named anything, the export is evaluated with that parser, never one guessed from a name
    assert parser_for_model(f"hf:{out}").name == "json_list"
    no_parser = ["eval", "configs/learn-arithmetic.yaml", "env.parser=null", "env.eval_tasks=2"]
    evaluated = CliRunner().invoke(
        app, [*no_parser, f"model.spec=hf:{out}", "--out", str(tmp_path / "eval-export")]
    )
    assert evaluated.exit_code == 0, evaluated.output
    bare = tmp_path / "bare"  # the same weights without the export's metadata
    shutil.copytree(out, bare)
    (bare / "tracerl_export.json").unlink()
    unknown = CliRunner().invoke(
        app, [*no_parser, f"model.spec=hf:{bare}", "--out", str(tmp_path / "eval-bare")]
    )
    assert unknown.exit_code == 2, unknown.output
    assert "no tool-call parser is known for model" in unknown.output
    assert "set env.parser" in unknown.output and "Traceback" not in unknown.output
    assert not list(out.glob("adapter_*")), "LoRA adapters are merged, not shipped apart"
    assert (out / "chat_template.jinja").exists() or "chat_template" in (
        out / "tokenizer_config.json"
    ).read_text()

    exported = load(f"hf:{out}")
    assert exported.renderer.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False
    ) == load("tiny-chars").renderer.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False
    )
    # the same numbers as the run's final policy, on what that policy sampled
    temperature = cfg.model.temperature
    gap = _gap_on_final_evaluation(run, exported.model.eval(), temperature)
    assert gap < 1e-3, gap
    untrained = _gap_on_final_evaluation(run, load("tiny-chars").model.eval(), temperature)
    assert untrained > 20 * max(gap, 1e-4), (untrained, gap)  # the check can tell them apart

    # --step: an older kept checkpoint; a deleted one is named with those that exist
    older = CliRunner().invoke(
        app, ["export", str(run), "--step", "1", "--out", str(tmp_path / "s1")]
    )
    assert older.exit_code == 0, older.output
    assert json.loads((tmp_path / "s1" / "tracerl_export.json").read_text())["step"] == 1
    gone = CliRunner().invoke(
        app, ["export", str(run), "--step", "0", "--out", str(tmp_path / "s0")]
    )
    assert gone.exit_code == 2 and "its checkpoints: 1, 2" in gone.output
    assert not (tmp_path / "s0").exists()
    # never over a folder that exists: what is there stays as it was
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    again = CliRunner().invoke(app, ["export", str(run), "--out", str(out)])
    assert again.exit_code == 2 and "already exists" in again.output
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
