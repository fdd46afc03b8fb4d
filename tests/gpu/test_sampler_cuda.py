"""The in-process sampler on CUDA: static key/value slots and a compiled (CUDA graph) decode
step draw the tokens the dynamic cache draws, mid-batch joins included, and the compiled
step really is captured (no silent fallback to eager)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from tests.conftest import skip_unless_compilable
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


def _gaps_to_a_full_forward(model, requests, results, gpu):
    """|sampled log-prob - a full forward's under the model's precision| for every token."""
    from tracerl.models.placement import computing

    gaps = []
    for req, res in zip(requests, results, strict=True):
        ids = torch.tensor([[*req.prompt_ids, *res.token_ids]], device=gpu)
        with torch.no_grad(), computing(model):
            logits = model(input_ids=ids).logits[0, len(req.prompt_ids) - 1 : -1].float()
        full = torch.log_softmax(logits, -1).gather(1, ids[0, len(req.prompt_ids) :, None])
        gaps.append((full[:, 0].cpu() - torch.tensor(res.logprobs)).abs())
    return torch.cat(gaps)


def test_static_and_compiled_decoding_draw_the_dynamic_caches_tokens(model, gpu):
    skip_unless_compilable(gpu)
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


def test_under_bf16_mixed_compiled_log_probs_match_the_learners_recompute(gpu):
    """The GPU default precision: the compiled step decodes through bf16 copies of the
    matmul weights (`CastWeights`, refreshed every batch); each token's log-prob must agree
    with a full forward under the learner's autocast within the bf16 tolerance docs/gpu.md
    states (0.1 max, 0.02 mean), before and after an update."""
    skip_unless_compilable(gpu)
    from tracerl.models.placement import computing

    mixed = place(load("tiny-random").model, resolve(gpu, "auto", "bf16-mixed"))
    sampler = BatchedHFSampler(mixed, seed=0, max_batch_size=8, kv_cache="static", compile=True)
    assert sampler._casts is not None
    opt = torch.optim.AdamW(mixed.parameters(), lr=1e-3)
    for _ in range(2):
        results = sampler.generate_batch(_requests(6))
        assert sampler.compile
        gap = _gaps_to_a_full_forward(mixed, _requests(6), results, gpu)
        assert gap.max() < 0.1 and gap.mean() < 0.02, (gap.max(), gap.mean())
        with computing(mixed):  # an update: the next batch must sample the new weights
            mixed(input_ids=torch.tensor([[1, 5, 9]], device=gpu)).logits.float().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def test_a_next_turn_from_kept_keys_and_values_matches_a_full_prefill(gpu):
    """Prefix caching on the GPU default precision (`bf16-mixed`: the kept keys and values
    are bf16, as the model computed them): an episode's next turns, started from what its
    last turn kept, draw log-probs a full forward under the learner's autocast gives them
    (the same bf16 tolerance), batched with a new episode; and after an update (a new
    policy version) nothing old is reused."""

    mixed = place(load("tiny-random").model, resolve(gpu, "auto", "bf16-mixed"))
    sampler = BatchedHFSampler(mixed, seed=0, max_batch_size=8)
    first = _requests(3, max_tokens=12)
    first = [SampleRequest(r.prompt_ids, 12, frozenset(), seed=r.seed, episode_id=f"e{i}")
             for i, r in enumerate(first)]  # fmt: skip
    results = sampler.generate_batch(first)
    tool = (17, 23, 99, 4, 31, 8)
    nxt = [SampleRequest((*r.prompt_ids, *x.token_ids, *tool), 12, frozenset(), seed=10 + i,
                         episode_id=r.episode_id)
           for i, (r, x) in enumerate(zip(first, results, strict=True))]  # fmt: skip
    nxt.append(SampleRequest(_requests(4)[3].prompt_ids, 12, frozenset(), seed=9, episode_id="n"))
    got = sampler.generate_batch(nxt)
    assert sampler.prefixes.stats.hits == 3
    gap = _gaps_to_a_full_forward(mixed, nxt, got, gpu)
    assert gap.max() < 0.1 and gap.mean() < 0.02, (gap.max(), gap.mean())
    sampler.policy_version += 1
    sampler.generate_batch([SampleRequest((*nxt[0].prompt_ids, *got[0].token_ids), 4,
                                          frozenset(), seed=1, episode_id="e0")])  # fmt: skip
    assert sampler.prefixes.stats.hits == 3 and sampler.prefixes.stats.cleared == 1
