"""`CastWeights`: a bf16-mixed model's matmul weights copied to bf16 once per batch, so a
compiled (CUDA graph) decode step reads bf16 weights instead of casting fp32 ones at every
replay; the copies compute exactly what autocast computes, and follow every update."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import skip_unless_compilable
from tracerl.models import load
from tracerl.models.cast_weights import CastWeights, castable
from tracerl.models.placement import computing, place, resolve
from tracerl.rollout import BatchedHFSampler, SampleRequest

IDS = torch.tensor([[1, 42, 7, 99, 5, 17, 3]])


@pytest.fixture
def mixed():
    return place(load("tiny-random").model, resolve("cpu", "auto", "bf16-mixed"))


def _logits(model):
    with torch.no_grad(), computing(model):
        return model(input_ids=IDS).logits.float()


def _update(model) -> None:
    """One fused AdamW step, as the learner takes it (fused kernels do not even bump the
    parameters' version counters: nothing may rely on them to see a change)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    with computing(model):
        model(input_ids=IDS).logits.float().logsumexp(-1).sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def test_the_bf16_view_computes_exactly_what_autocast_computes(mixed):
    casts = CastWeights(mixed)
    assert torch.equal(_logits(casts.view), _logits(mixed))
    linear = [m for m in casts.view.modules() if isinstance(m, torch.nn.Linear)]
    assert linear and all(m.weight.dtype == torch.bfloat16 for m in linear)
    # the rest is the model's own memory: embeddings and norms are not copied
    emb, master_emb = casts.view.get_input_embeddings(), mixed.get_input_embeddings()
    assert emb.weight.data_ptr() == master_emb.weight.data_ptr()
    assert emb.weight.dtype == torch.float32
    n_linear = sum(m.weight.numel() for m in mixed.modules() if isinstance(m, torch.nn.Linear))
    assert casts.nbytes() == 2 * n_linear
    assert all(p.dtype == torch.float32 for p in mixed.parameters())  # the master untouched


def test_a_refresh_follows_an_update_in_place(mixed):
    casts = CastWeights(mixed)
    before = _logits(mixed)
    addresses = [cast.data_ptr() for _, cast in casts.pairs]
    _update(mixed)
    after = _logits(mixed)
    assert not torch.equal(before, after)
    assert not torch.equal(_logits(casts.view), after)  # stale until refreshed
    casts.refresh()
    assert torch.equal(_logits(casts.view), after)
    assert [cast.data_ptr() for _, cast in casts.pairs] == addresses  # a capture stays valid


def test_only_a_mixed_models_fp32_weights_are_copied():
    fp32 = load("tiny-random").model
    assert not castable(fp32)
    with pytest.raises(ValueError, match="bf16-mixed model with fp32 weights"):
        CastWeights(fp32)
    lora_base = place(
        load("tiny-random").model, resolve("cpu", "auto", "bf16-mixed").for_lora_base()
    )
    assert not castable(lora_base)


def test_a_compiled_sampler_under_bf16_mixed_decodes_the_updated_weights(mixed):
    """The sampler's compiled path under bf16-mixed samples from the copies, refreshed at
    every batch: after an update, its tokens are those an eager sampler draws from the
    updated model."""
    skip_unless_compilable("cpu")
    request = SampleRequest([1, 42, 7, 99, 5], 8, frozenset(), seed=3)
    sampler = BatchedHFSampler(mixed, kv_cache="static", compile=True, max_batch_size=2)
    assert sampler._casts is not None
    eager = BatchedHFSampler(mixed, kv_cache="static", max_batch_size=2)
    assert eager._casts is None  # eager decoding keeps autocast's per-batch cast
    drawn = []
    for _ in range(2):
        (got,) = sampler.generate_batch([request])
        drawn.append(got.token_ids)
        (want,) = eager.generate_batch([request])
        assert sampler.compile  # it compiled
        assert got.token_ids == want.token_ids
        assert torch.allclose(torch.tensor(got.logprobs), torch.tensor(want.logprobs), atol=1e-2)
        _update(mixed)
    assert drawn[0] != drawn[1]  # the update changed what is drawn: stale copies would show
