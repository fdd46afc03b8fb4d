"""``trainer.micro_batch_tokens: auto``: micro-batches sized from the GPU's free memory (less
the update's gradients and AdamW state), 4096 on a CPU; checked here with the free memory
given, since no GPU is here (tests/gpu runs it for real)."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tracerl.models import load
from tracerl.models.placement import Placement, place
from tracerl.train.memory import micro_batch_tokens, per_token_bytes

GIB = 2**30


@pytest.fixture(scope="module")
def smollm2_1_7b_shape():
    """SmolLM2-1.7B's shape on the meta device (no memory): 1.711 B parameters."""
    config = LlamaConfig(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=24,
        num_attention_heads=32, num_key_value_heads=32, vocab_size=49152,
        tie_word_embeddings=True,
    )  # fmt: skip
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    # placed as bf16-mixed places it (fp32 weights, bf16 compute), kept on the meta device
    return place(
        model, Placement(torch.device("meta"), torch.float32, torch.bfloat16, "bf16-mixed")
    )


def test_a_number_is_itself_and_auto_on_a_cpu_is_the_default():
    model = load("tiny-random").model
    assert micro_batch_tokens(2048, model)[0] == 2048
    tokens, why = micro_batch_tokens("auto", model)
    assert tokens == 4096 and "cpu" in why


def test_auto_leaves_room_for_the_update_and_grows_with_the_free_memory(smollm2_1_7b_shape):
    model = smollm2_1_7b_shape
    params = sum(p.numel() for p in model.parameters())
    per_token = per_token_bytes(model.config, torch.bfloat16)
    small, why = micro_batch_tokens("auto", model, free_bytes=40 * GIB)
    large, _ = micro_batch_tokens("auto", model, free_bytes=120 * GIB)
    assert small % 1024 == 0 and large % 1024 == 0 and 1024 <= small < large
    # what it leaves: the gradients and both AdamW moments in fp32 (12 bytes a parameter)
    assert f"{12 * params / GIB:.1f} GiB of gradients and AdamW state" in why
    assert small * per_token <= 0.9 * 40 * GIB - 12 * params
    assert (small + 1024) * per_token > 0.9 * 40 * GIB - 12 * params - 3 * 1024 * 49152 * 4
    # checkpointing keeps a tenth of the activations: about ten times the tokens
    ckpt, _ = micro_batch_tokens("auto", model, free_bytes=40 * GIB, checkpointing=True)
    assert ckpt >= 8 * small


def test_auto_says_what_to_do_when_not_even_the_update_fits(smollm2_1_7b_shape):
    with pytest.raises(MemoryError, match=r"gradient_checkpointing|model\.lora") as e:
        micro_batch_tokens("auto", smollm2_1_7b_shape, free_bytes=16 * GIB)
    assert "16.0 GiB free" in str(e.value) and "19.1 GiB" in str(e.value)


def test_the_config_takes_auto_and_refuses_anything_else():
    from pydantic import ValidationError

    from tracerl.config import RunConfig

    cfg = RunConfig.model_validate({"trainer": {"micro_batch_tokens": "auto"}})
    assert cfg.trainer.micro_batch_tokens == "auto"
    with pytest.raises(ValidationError, match="micro_batch_tokens"):
        RunConfig.model_validate({"trainer": {"micro_batch_tokens": "max"}})
    with pytest.raises(ValidationError, match="micro_batch_tokens"):
        RunConfig.model_validate({"trainer": {"micro_batch_tokens": 8}})


def test_a_run_with_auto_trains_at_the_size_it_chose(tmp_path):
    from tracerl.train.run import Run

    run = Run.from_config(
        "configs/learn-arithmetic.yaml",
        overrides=[f"out_dir={tmp_path}", "trainer.micro_batch_tokens=auto", "model.device=cpu"],
    )
    assert run.micro_batch_sizing[0] == 4096
    assert run.learner_config.micro_batch_tokens == 4096
