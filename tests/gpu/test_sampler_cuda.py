"""The in-process sampler on CUDA: static key/value slots and a compiled (CUDA graph) decode
step draw the tokens the dynamic cache draws, mid-batch joins included, and the compiled
step really is captured (no silent fallback to eager)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from tracerl.models import load
from tracerl.models.placement import place, resolve
from tracerl.rollout import BatchedHFSampler, SampleRequest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def model(gpu):
    return place(load("tiny-random").model, resolve(gpu, "auto", "fp32"))


def _requests(n: int, max_tokens: int = 24) -> list[SampleRequest]:
    return [
        SampleRequest([1, *range(40 + 3 * i, 60 + 5 * i)], max_tokens, frozenset(), seed=i)
        for i in range(n)
    ]


def _assert_same(got, ref, atol: float = 1e-4) -> None:
    for g, r in zip(got, ref, strict=True):
        assert g.token_ids == r.token_ids
        assert torch.allclose(torch.tensor(g.logprobs), torch.tensor(r.logprobs), atol=atol)


def test_static_and_compiled_decoding_draw_the_dynamic_caches_tokens(model, gpu):
    import torch._dynamo

    torch._dynamo.reset()
    requests = _requests(6)
    dynamic = BatchedHFSampler(model, seed=0, max_batch_size=8).generate_batch(requests)
    static = BatchedHFSampler(model, seed=0, max_batch_size=8, kv_cache="static")
    _assert_same(static.generate_batch(requests), dynamic)
    compiled = BatchedHFSampler(model, seed=0, max_batch_size=8, kv_cache="static", compile=True)
    _assert_same(compiled.generate_batch(requests), dynamic)
    _assert_same(compiled.generate_batch(requests), dynamic)  # the replayed capture
    assert compiled.compile  # no fallback to eager
    if gpu == "cuda":  # captured as a CUDA graph (on the CPU dry run there are none)
        counters = torch._dynamo.utils.counters["inductor"]
        assert counters.get("cudagraph_skips", 0) == 0, dict(counters)


def test_turns_join_a_compiled_batch_and_draw_their_own_tokens(model):
    sampler = BatchedHFSampler(model, seed=0, max_batch_size=3, kv_cache="static", compile=True)
    requests = _requests(7, max_tokens=10)
    for i, r in enumerate(requests):
        requests[i] = SampleRequest(r.prompt_ids, 4 + 3 * i, frozenset(), seed=r.seed)

    async def run():
        return await asyncio.gather(*(sampler.sample(r) for r in requests))

    got = asyncio.run(run())
    assert sampler.stats.admitted >= 1
    alone = BatchedHFSampler(model, seed=0, max_batch_size=1)
    _assert_same(got, [alone.generate_batch([r])[0] for r in requests])
