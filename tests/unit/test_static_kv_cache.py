"""`model.kv_cache: static` (and `model.compile`): the sampler decodes from slots of a
transformers `StaticCache` allocated once, every step the same shapes (what CUDA graphs
need), and still draws each seeded row's own tokens, joins turns mid-batch and reuses a
finished row's slot."""

from __future__ import annotations

import asyncio
import logging
import re
import time

import pytest
import torch

from tests.conftest import skip_unless_compilable
from tests.unit.test_batched_sampler import SEEDED, _gather, _prompts
from tracerl.models import load
from tracerl.rollout import BatchedHFSampler, HFSampler, SampleRequest
from tracerl.rollout.decode_batch import StaticSlots, slot_length


@pytest.fixture(scope="module")
def bundle():
    return load("tiny-random")


def _alone(bundle, request: SampleRequest):
    return HFSampler(bundle.model).generate(
        request.prompt_ids,
        max_tokens=request.max_tokens,
        stop_token_ids=tuple(request.stop_token_ids),
        seed=request.seed,
    )


def _same(got, ref) -> None:
    assert got.token_ids == ref.token_ids
    assert got.finish_reason == ref.finish_reason
    assert torch.allclose(torch.tensor(got.logprobs), torch.tensor(ref.logprobs), atol=1e-4)


def _static(bundle, **kw) -> BatchedHFSampler:
    return BatchedHFSampler(bundle.model, kv_cache="static", **kw)


def test_static_slots_draw_the_seeded_tokens_the_dynamic_cache_draws(bundle):
    requests = [SampleRequest(p, 10, frozenset(), seed=s) for p, s, _ in SEEDED]
    got = _static(bundle, seed=0).generate_batch(requests)
    assert [r.token_ids for r in got] == [want for _, _, want in SEEDED]


def test_rows_stop_at_their_own_ends_and_every_step_feeds_every_slot(bundle):
    prompts = _prompts(bundle, 6)
    max_tokens = [10, 3, 10, 7, 10, 1]
    refs = [
        _alone(bundle, SampleRequest(p, max_tokens=m, seed=i))
        for i, (p, m) in enumerate(zip(prompts, max_tokens, strict=True))
    ]
    stops = [frozenset({refs[i].token_ids[2]}) if i % 2 == 0 else frozenset() for i in range(6)]
    requests = [
        SampleRequest(p, max_tokens=m, stop_token_ids=s, seed=i)
        for i, (p, m, s) in enumerate(zip(prompts, max_tokens, stops, strict=True))
    ]
    sampler = _static(bundle, max_batch_size=8, policy_version=3)
    shapes = []
    forward = sampler.model.forward

    def spy(*a, **k):
        shapes.append((tuple(k["input_ids"].shape), tuple(k["attention_mask"].shape)))
        return forward(*a, **k)

    sampler.model.forward = spy
    try:
        results = asyncio.run(_gather(sampler, requests))
    finally:
        del sampler.model.forward
    assert sampler.stats.batches == 1 and sampler.stats.forward_calls <= max(max_tokens)
    for req, res in zip(requests, results, strict=True):
        ref = _alone(bundle, req)
        _same(res, ref)
        assert res.policy_version == 3
    # after the prefill every decode step has one shape: all 8 slots, the whole cache
    length = slot_length(max(len(p) + m for p, m in zip(prompts, max_tokens, strict=True)))
    assert set(shapes[1:]) == {((8, 1), (8, length))}


def test_a_finished_rows_slot_goes_to_the_turn_that_joins(bundle):
    """max_batch_size 2, five turns: the waiting turns take the finished rows' slots in
    the running batch; the cache is never larger than two slots."""
    sampler = _static(bundle, max_batch_size=2)
    prompts = _prompts(bundle, 5)
    requests = [SampleRequest(p, max_tokens=2 + i, seed=i) for i, p in enumerate(prompts)]
    results = asyncio.run(_gather(sampler, requests))
    assert sampler.stats.batches == 1 and sampler.stats.admitted == 3
    assert sampler.stats.max_batch == 2
    slots = sampler._slot_store["slots"]
    assert slots.batch == 2
    for req, res in zip(requests, results, strict=True):
        _same(res, _alone(bundle, req))


def test_a_turn_longer_than_the_write_position_waits_then_joins(bundle):
    """A joining turn's keys and values end at the batch's write position, so a prompt
    longer than it waits (in its place in the queue) until the position reaches it, while
    a shorter turn that arrived after it joins at once; both draw their own tokens."""
    short_prompt = _prompts(bundle, 1)[0][:8]
    long_prompt = _prompts(bundle, 1)[0]  # longer than the batch's first write position
    first = SampleRequest(short_prompt, max_tokens=len(long_prompt) + 10, seed=1)
    later_long = SampleRequest(long_prompt, max_tokens=5, seed=2)
    later_short = SampleRequest(short_prompt[:6], max_tokens=5, seed=3)
    sampler = _static(bundle, max_batch_size=4)
    joined_at: dict[int, int] = {}  # seed: the write position when it joined
    forward, calls = sampler._slot_forward, []

    def paced(*a, **k):  # the two later turns arrive during the batch's first decode step
        calls.append(1)
        if len(calls) == 1:
            deadline = time.monotonic() + 60
            while len(sampler._pending) < 2 and time.monotonic() < deadline:
                time.sleep(0.001)
        return forward(*a, **k)

    take = sampler._take

    def recorded(n, fits=None):
        got = take(n, fits)
        if fits is not None:  # a running batch admits them
            for req, _ in got:
                joined_at[req.seed] = sampler._slot_store["slots"].written
        return got

    sampler._slot_forward, sampler._take = paced, recorded

    async def run():
        t = asyncio.create_task(sampler.sample(first))
        while not calls:
            await asyncio.sleep(0.001)
        long_t = asyncio.create_task(sampler.sample(later_long))
        await asyncio.sleep(0)
        short_t = asyncio.create_task(sampler.sample(later_short))
        return await asyncio.gather(t, long_t, short_t)

    results = asyncio.run(run())
    assert sampler.stats.batches == 1 and sampler.stats.admitted == 2
    # the short turn joined first; the long one once the position passed its length
    assert joined_at[3] < joined_at[2]
    assert joined_at[2] >= len(long_prompt)
    for req, res in zip([first, later_long, later_short], results, strict=True):
        _same(res, _alone(bundle, req))


def test_slots_are_allocated_once_and_reused_by_every_batch_that_fits(bundle):
    sampler = _static(bundle, max_batch_size=4)
    prompts = _prompts(bundle, 3)
    sampler.generate_batch(
        [SampleRequest(p, 20, frozenset(), seed=i) for i, p in enumerate(prompts)]
    )
    slots = sampler._slot_store["slots"]
    keys = slots.cache.layers[0].keys.data_ptr()
    again = [SampleRequest(p, 5, frozenset(), seed=10 + i) for i, p in enumerate(prompts[1:])]
    for req, res in zip(again, sampler.generate_batch(again), strict=True):
        _same(res, _alone(bundle, req))  # stale keys from the last batch are masked
    assert sampler._slot_store["slots"] is slots
    assert slots.cache.layers[0].keys.data_ptr() == keys  # same memory: a capture stays valid
    # a batch that needs more positions gets a longer cache
    longer = SampleRequest(prompts[0], slots.length, frozenset(), seed=3)
    (res,) = sampler.generate_batch([longer])
    assert sampler._slot_store["slots"].length > slots.length
    assert len(res.token_ids) == longer.max_tokens
    # (the first 64 of its 256 tokens: tiny-random's near-uniform logits make a late
    # near-tie, which batched kernels' rounding may break either way, likely)
    ref = _alone(bundle, SampleRequest(prompts[0], 64, frozenset(), seed=3))
    assert res.token_ids[:64] == ref.token_ids


def test_an_evaluation_sampler_shares_the_slots(bundle):
    train = _static(bundle, max_batch_size=4)
    greedy = train.with_temperature(0.0, seed=1)
    assert greedy.kv_cache == "static"
    request = SampleRequest(_prompts(bundle, 1)[0], 6, frozenset(), seed=1)
    train.generate_batch([request])
    (out,) = greedy.generate_batch([request])
    assert greedy._slot_store["slots"] is train._slot_store["slots"]
    with torch.no_grad():
        ids = list(request.prompt_ids)
        for tok in out.token_ids:  # greedy: each token the argmax given those before
            assert tok == int(bundle.model(torch.tensor([ids])).logits[0, -1].argmax())
            ids.append(tok)


def test_under_bf16_mixed_a_static_turn_casts_the_weights_once(monkeypatch):
    from tracerl.models.placement import place, resolve

    model = place(load("tiny-random").model, resolve("cpu", "auto", "bf16-mixed"))
    dropped = []
    clear = torch.clear_autocast_cache
    monkeypatch.setattr(torch, "clear_autocast_cache", lambda: (dropped.append(1), clear()))
    sampler = BatchedHFSampler(model, kv_cache="static", seed=0)
    (out,) = sampler.generate_batch([SampleRequest((1, 42, 7, 99, 5), 8, frozenset(), seed=3)])
    assert len(out.token_ids) == 8 and len(dropped) == 1
    assert next(model.parameters()).dtype == torch.float32


def test_compiled_decode_steps_draw_the_same_tokens(bundle):
    """``model.compile``: the decode step through transformers' ``get_compiled_call``
    (torch.compile, mode reduce-overhead: CUDA graphs on a GPU; inductor's C++ on this
    CPU). Same tokens as eager decoding, and the second batch compiles nothing new."""
    skip_unless_compilable("cpu")
    import torch._dynamo

    torch._dynamo.reset()
    requests = [
        SampleRequest(p, 12, frozenset(), seed=i) for i, p in enumerate(_prompts(bundle, 3))
    ]
    eager = _static(bundle, max_batch_size=4).generate_batch(requests)
    sampler = _static(bundle, max_batch_size=4, compile=True)
    compiled = sampler.generate_batch(requests)
    assert sampler.compile  # it compiled (a failure falls back with compile off)
    for got, ref in zip(compiled, eager, strict=True):
        _same(got, ref)
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    again = sampler.generate_batch(requests[1:])
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == frames  # no recompile
    for got, ref in zip(again, eager[1:], strict=True):
        _same(got, ref)


def test_a_step_that_fails_to_compile_warns_and_decodes_eagerly(bundle, caplog):
    skip_unless_compilable("cpu")
    sampler = _static(bundle, max_batch_size=4, compile=True)

    def broken(**kwargs):
        for layer in kwargs["cache"].layers:  # it counted its write before failing
            layer.cumulative_length.add_(1)
        raise RuntimeError("inductor: no C++ compiler")

    sampler._compiled_call = lambda: broken
    request = SampleRequest(_prompts(bundle, 1)[0], 6, frozenset(), seed=4)
    with caplog.at_level(logging.WARNING, logger="tracerl.rollout.batched"):
        (out,) = sampler.generate_batch([request])
    assert not sampler.compile
    assert "compiled decode step failed" in caplog.text and "no C++ compiler" in caplog.text
    _same(out, _alone(bundle, request))


def test_a_model_with_sliding_window_layers_keeps_the_dynamic_cache(caplog):
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, sliding_window=4,
    )  # fmt: skip
    torch.manual_seed(0)
    model = MistralForCausalLM(config).eval()
    assert "not all full attention" in StaticSlots.supported(model)
    with caplog.at_level(logging.WARNING, logger="tracerl.rollout.batched"):
        sampler = BatchedHFSampler(model, kv_cache="static", compile=True)
    assert sampler.kv_cache == "dynamic" and not sampler.compile
    assert "model.kv_cache: static is not possible" in caplog.text
    (out,) = sampler.generate_batch([SampleRequest([1, 5, 9, 3, 7, 2], 6, frozenset(), seed=1)])
    assert len(out.token_ids) == 6


def test_the_config_refuses_compile_without_static_slots_and_the_run_passes_them_on():
    skip_unless_compilable("cpu")
    from pydantic import ValidationError

    from tracerl.config import RunConfig

    with pytest.raises(
        ValidationError, match=re.escape("model.compile: true needs model.kv_cache: static")
    ):
        RunConfig.model_validate({"model": {"spec": "tiny-random", "compile": True}})
    with pytest.raises(ValidationError, match="kv_cache"):
        RunConfig.model_validate({"model": {"spec": "tiny-random", "kv_cache": "paged"}})
    with pytest.raises(ValueError, match=re.escape("compile=True needs kv_cache='static'")):
        BatchedHFSampler(load("tiny-random").model, compile=True)

    from tracerl.train.run import Run

    run = Run.from_config(model={"spec": "tiny-random", "kv_cache": "static", "compile": True})
    sampler = run.sampler
    assert sampler.kv_cache == "static" and sampler.compile


def test_a_short_prompt_with_many_tokens_beside_a_long_prompt_fits_its_slot(bundle):
    """Every row's keys end where the widest prompt's end, so the slots must hold the widest
    prompt plus the largest max_tokens (not the largest prompt + max_tokens of one row)."""
    long_prompt = _prompts(bundle, 1)[0]
    requests = [
        SampleRequest(long_prompt, 2, frozenset(), seed=1),
        SampleRequest(long_prompt[:4], 250, frozenset(), seed=2),
    ]
    sampler = _static(bundle, max_batch_size=2)
    results = sampler.generate_batch(requests)
    assert [len(r.token_ids) for r in results] == [2, 250]
    assert sampler._slot_store["slots"].length >= len(long_prompt) + 250
    _same(results[0], _alone(bundle, requests[0]))
    ref = _alone(bundle, SampleRequest(long_prompt[:4], 32, frozenset(), seed=2))
    assert results[1].token_ids[:32] == ref.token_ids


def test_a_torch_whose_compiled_step_crashes_the_backward_decodes_eagerly(
    bundle, monkeypatch, caplog
):
    """torch 2.11 on a CPU segfaults in the learner's backward after a decode step compiled
    in the sampler's worker thread (reproduced with PyPI's 2.11.0; 2.13.0 runs it): there
    `model.compile` is turned off with a warning that says why, not left to end the run."""
    monkeypatch.setattr(torch, "__version__", "2.11.0+cu130")
    with caplog.at_level(logging.WARNING, logger="tracerl.rollout.batched"):
        sampler = BatchedHFSampler(bundle.model, kv_cache="static", compile=True)
    assert sampler.compile is False and sampler.kv_cache == "static"
    assert "segmentation fault" in caplog.text and "2.11.0+cu130" in caplog.text
    assert StaticSlots.compile_unsafe(torch.device("cuda", 0)) is None  # on a GPU: measured there
    monkeypatch.setattr(torch, "__version__", "2.13.0+cpu")
    assert StaticSlots.compile_unsafe(torch.device("cpu")) is None
    assert BatchedHFSampler(bundle.model, kv_cache="static", compile=True).compile is True
