"""Which teacher a ``trainer.distill.teacher`` names, loaded as trained: a spec, a run (its
latest or a named checkpoint, LoRA adapters included) or a checkpoint folder; a teacher whose
tokenizer is not the student's is refused before any model loads."""

from __future__ import annotations

import types

import pytest
import torch

from tracerl.config import ConfigError
from tracerl.config.loading import load_config
from tracerl.models import ModelNotFoundError, load
from tracerl.models.refs import parse_model_ref
from tracerl.preflight import check_teacher
from tracerl.train.checkpoint import save_checkpoint
from tracerl.train.distill import load_teacher
from tracerl.train.lora import apply_lora

SAMPLER = types.SimpleNamespace(policy_version=3)
IDS = torch.tensor([[1, 9690, 198, 2683, 359, 253, 5356]])


def trained_run(tmp_path, lora=None, steps=(4, 7)):
    """A run directory whose checkpoints hold weights unlike the base's."""
    model = load("tiny-random").model
    if lora is not None:
        model = apply_lora(model, **lora)
    run = tmp_path / "run"
    run.mkdir()
    model_yaml = "model: {spec: tiny-random" + (f", lora: {lora}" if lora else "") + "}\n"
    (run / "config.yaml").write_text(model_yaml.replace("'", ""))
    with torch.no_grad():
        for step in steps:
            for p in model.parameters():
                if p.requires_grad:
                    p.add_(0.01 * step * torch.randn_like(p))
            save_checkpoint(run, step, model, None, SAMPLER, {})
    return run, model


def logits(model):
    with torch.no_grad():
        return model(IDS).logits


def test_a_run_loads_its_latest_checkpoint_and_a_named_one(tmp_path):
    run, last = trained_run(tmp_path)
    ref = parse_model_ref(f"run:{run}")
    assert ref.spec == "tiny-random" and ref.checkpoint == run / "checkpoints" / "step_7"
    teacher = load_teacher(ref, "cpu", "float32", 4096)
    assert torch.allclose(logits(teacher.model), logits(last), atol=1e-5)
    assert teacher.label == f"run:{run}" and "+" in teacher.identity  # the weights' hash
    older = load_teacher(parse_model_ref(f"run:{run}@4"), "cpu", "float32", 4096)
    assert older.identity != teacher.identity
    assert not torch.allclose(logits(older.model), logits(last), atol=1e-3)
    folder = parse_model_ref(str(run / "checkpoints" / "step_7"))
    assert folder.checkpoint == ref.checkpoint and folder.spec == "tiny-random"


def test_a_lora_run_loads_its_adapters_on_the_base(tmp_path):
    lora = {"r": 4, "alpha": 8}
    run, trained = trained_run(tmp_path, lora=lora, steps=(2,))
    ref = parse_model_ref(f"run:{run}")
    assert ref.lora == lora
    teacher = load_teacher(ref, "cpu", "float32", 4096)
    assert torch.allclose(logits(teacher.model), logits(trained), atol=1e-4)
    base = load("tiny-random").model
    assert not torch.allclose(logits(teacher.model), logits(base), atol=1e-3)


def test_a_reference_that_names_nothing_says_what_is_missing(tmp_path):
    with pytest.raises(ModelNotFoundError, match="no checkpoint under"):
        parse_model_ref(f"run:{tmp_path}")  # a folder, but no checkpoint in it
    with pytest.raises(ModelNotFoundError, match=r"there is no run at .* \(no such folder\)"):
        parse_model_ref(f"run:{tmp_path / 'missing'}")
    run, _ = trained_run(tmp_path, steps=(4,))
    with pytest.raises(ModelNotFoundError, match="no checkpoint after step '9'"):
        parse_model_ref(f"run:{run}@9")
    with pytest.raises(ModelNotFoundError, match="unknown model spec"):
        parse_model_ref("gpt-17")


def test_a_teacher_of_another_tokenizer_is_refused_when_the_config_loads(tmp_path):
    with pytest.raises(ConfigError, match=r"does not share model\.spec 'tiny-random'.s tokenizer"):
        load_config(
            "configs/learn-arithmetic.yaml",
            [f"out_dir={tmp_path}", "model.spec=tiny-random", "trainer.distill.teacher=tiny-chars"],
        )
    run, _ = trained_run(tmp_path, steps=(4,))  # a run of tiny-random: its base's tokenizer
    with pytest.raises(ConfigError, match="cross-tokenizer distillation is not supported"):
        load_config(
            "configs/learn-arithmetic.yaml",  # tiny-chars
            [f"out_dir={tmp_path}", f"trainer.distill.teacher=run:{run}"],
        )
    same = load_config(
        "configs/learn-arithmetic.yaml",
        [f"out_dir={tmp_path}", "trainer.distill.teacher=tiny-chars"],
    )
    check_teacher(same)  # tiny-chars and tiny-chars: one tokenizer
    # a run that does not exist yet loads (it may be trained first); tracerl train's
    # preflight says what is missing before anything loads
    later = load_config(None, [f"out_dir={tmp_path}", "trainer.distill.teacher=run:nowhere"])
    with pytest.raises(
        ConfigError, match=r"trainer\.distill\.teacher: run:nowhere: there is no run"
    ):
        check_teacher(later)
    # and a config built in code with another tokenizer's teacher is refused there too
    odd = same.model_copy(update={"model": same.model.model_copy(update={"spec": "tiny-random"})})
    with pytest.raises(ConfigError, match="does not share"):
        check_teacher(odd)


def test_a_teacher_whose_weights_do_not_load_is_a_clear_error_when_first_asked(tmp_path):
    from tracerl.errors import UserError
    from tracerl.train.distill import Deferred

    run, _ = trained_run(tmp_path, steps=(4,))
    (run / "checkpoints" / "step_4" / "model.pt").write_bytes(b"not a checkpoint")
    ref = parse_model_ref(f"run:{run}")
    teacher = Deferred(lambda: load_teacher(ref, "cpu", "float32", 4096), f"run:{run}")
    assert repr(teacher) == f"teacher('run:{run}')"  # nothing loaded yet
    with pytest.raises(UserError, match=r"trainer\.distill\.teacher: run:.* did not load"):
        teacher.logprobs([], 1.0)
