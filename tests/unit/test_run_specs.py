"""``model.spec`` may name a run's checkpoint (``run:runs/NAME[@step]``, a checkpoint folder)
wherever it names a model: it loads as the run's base model with the checkpoint's weights,
with the base's tokenizer, an id naming the checkpoint's hash, and the parser the run
trained with; a reference that names nothing says what there is instead."""

from __future__ import annotations

import shutil

import pytest
import torch

from tests.unit.test_distill_teachers import logits, trained_run
from tracerl.config import ConfigError
from tracerl.envs.parsers import NoParserError, parser_for_model
from tracerl.models import ModelNotFoundError, load
from tracerl.models.refs import parse_model_ref, tokenizer_of
from tracerl.models.specs import check_spec
from tracerl.preflight import check_model
from tracerl.train.checkpoint import save_checkpoint


def test_a_run_loads_as_its_base_with_the_checkpoint_weights(tmp_path):
    run, last = trained_run(tmp_path)
    bundle = load(f"run:{run}")
    base = load("tiny-random")
    assert bundle.spec == f"run:{run}" and bundle.origin == "checkpoint"
    assert bundle.model_id.startswith(base.model_id + "+")  # the checkpoint's hash
    assert torch.allclose(logits(bundle.model), logits(last), atol=1e-5)
    assert bundle.tokenizer.get_vocab() == base.tokenizer.get_vocab()
    assert tokenizer_of(f"run:{run}").get_vocab() == base.tokenizer.get_vocab()
    older = load(str(run / "checkpoints" / "step_4"))  # the folder form
    assert older.model_id != bundle.model_id
    assert older.model_id == load(f"run:{run}@4").model_id


def test_a_run_trained_from_another_runs_checkpoint_loads_through_it(tmp_path):
    first, _ = trained_run(tmp_path)
    second = tmp_path / "second"
    second.mkdir()
    (second / "config.yaml").write_text(f"model: {{spec: 'run:{first}@4'}}\n")
    model = load(f"run:{first}@4").model
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    save_checkpoint(second, 0, model, None, type("S", (), {"policy_version": 1})(), {})
    ref = parse_model_ref(f"run:{second}")
    assert ref.spec == f"run:{first}@4"
    again = load(f"run:{second}")
    assert torch.allclose(logits(again.model), logits(model), atol=1e-5)
    assert parser_for_model(f"run:{second}").name == "json_list"  # tiny-random's, via the first


def test_the_parser_is_the_runs_never_the_name(tmp_path):
    run, _ = trained_run(tmp_path)
    assert parser_for_model(f"run:{run}").name == "json_list"  # the base's default
    (run / "config.yaml").write_text("model: {spec: tiny-random}\nenv: {parser: hermes}\n")
    assert parser_for_model(f"run:{run}@4").name == "hermes"  # the run trained with it
    assert parser_for_model(str(run / "checkpoints" / "step_7")).name == "hermes"
    # a base that names no parser: a run called "qwen-..." is not taken for a Qwen
    folder = tmp_path / "some-model"  # the files a model folder has (nothing here loads it)
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "mystery"}')
    (folder / "model.safetensors").write_bytes(b"")
    (folder / "tokenizer.json").write_text("{}")
    (folder / "tokenizer_config.json").write_text('{"chat_template": "{{ messages }}"}')
    named = tmp_path / "qwen-run"
    shutil.copytree(run, named)
    (named / "config.yaml").write_text(f"model: {{spec: 'hf:{folder}'}}\n")
    with pytest.raises(NoParserError, match="no tool-call parser is known for model 'run:") as e:
        parser_for_model(f"run:{named}")
    assert "set env.parser" in str(e.value.hint)


def test_a_reference_that_names_nothing_says_what_there_is(tmp_path):
    run, _ = trained_run(tmp_path)
    check_spec(f"run:{run}@7")
    check_model(str(run / "checkpoints" / "step_4"))
    with pytest.raises(ModelNotFoundError, match="no checkpoint after step '5'") as e:
        check_spec(f"run:{run}@5")
    assert e.value.hint == "its checkpoints: 4, 7"
    with pytest.raises(ConfigError, match=r"^model\.spec: .*step_5: no checkpoint there") as e:
        check_model(str(run / "checkpoints" / "step_5"))
    assert e.value.hint == "its run's checkpoints: 4, 7"
    with pytest.raises(ConfigError, match="there is no run at"):
        check_model(f"run:{tmp_path / 'nope'}")
    with pytest.raises(ModelNotFoundError, match=r"run:<run dir>\[@step\]") as e:
        check_spec("gpt-17")  # the unknown spec's list names the run form, its hint how
    assert "run:runs/NAME@7" in str(e.value.hint)
    (run / "config.yaml").write_text(f"model: {{spec: 'run:{run}'}}\n")
    with pytest.raises(ModelNotFoundError, match="names the run itself"):
        check_spec(f"run:{run}")
