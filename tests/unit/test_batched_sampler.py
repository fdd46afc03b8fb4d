"""BatchedHFSampler: the same tokens and logprobs as the plain sampler, fewer forward passes."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from tracerl.models import load
from tracerl.rollout import BatchedHFSampler, HFSampler, SampleRequest


@pytest.fixture(scope="module")
def bundle():
    return load("tiny-random")


def _prompts(bundle, n: int) -> list[list[int]]:
    """n prompts of different lengths (so the batch needs left padding)."""
    base = bundle.renderer.start([{"role": "user", "content": "Tell me a story about cats."}])
    return [base.token_ids[: len(base.token_ids) - 3 * i] for i in range(n)]


async def _gather(sampler, requests):
    return await asyncio.gather(*(sampler.sample(r) for r in requests))


def _pace(sampler, ready) -> None:
    """However busy the machine, a turn asked for mid-batch joins it: once `ready()` (asked
    before each forward) and while nothing has joined yet, a forward waits (at most 60 s)
    until a turn is waiting (or, asked sooner, has joined already)."""
    forward = sampler._forward

    def paced(*args, **kwargs):
        if ready() and not sampler.stats.admitted:
            deadline = time.monotonic() + 60
            while not (sampler._pending or sampler.stats.admitted):
                if time.monotonic() > deadline:
                    break
                time.sleep(0.001)
        return forward(*args, **kwargs)

    sampler._forward = paced


def test_batched_results_equal_the_plain_sampler_token_for_token(bundle):
    requests = [
        SampleRequest(p, max_tokens=16, seed=100 + i) for i, p in enumerate(_prompts(bundle, 4))
    ]
    batched = BatchedHFSampler(bundle.model, temperature=1.0, seed=0)
    results = asyncio.run(_gather(batched, requests))
    assert batched.stats.batches == 1 and batched.stats.max_batch == 4
    plain = HFSampler(bundle.model, temperature=1.0, seed=0)
    for req, res in zip(requests, results, strict=True):
        ref = plain.generate(req.prompt_ids, max_tokens=16, stop_token_ids=(), seed=req.seed)
        assert res.token_ids == ref.token_ids
        assert res.finish_reason == ref.finish_reason == "length"
        assert torch.allclose(torch.tensor(res.logprobs), torch.tensor(ref.logprobs), atol=1e-4)


def test_batched_logprobs_equal_a_full_unpadded_forward_pass(bundle):
    temperature = 0.7
    prompts = _prompts(bundle, 3)
    sampler = BatchedHFSampler(bundle.model, temperature=temperature, seed=5)
    results = sampler.generate_batch([SampleRequest(p, max_tokens=12) for p in prompts])
    for prompt, res in zip(prompts, results, strict=True):
        assert res.finish_reason == "length" and len(res.token_ids) == 12
        with torch.no_grad():
            logits_T_V = bundle.model(torch.tensor([prompt + res.token_ids])).logits[0]
        logp_T_V = torch.log_softmax(logits_T_V[len(prompt) - 1 : -1] / temperature, dim=-1)
        full_T = logp_T_V.gather(1, torch.tensor(res.token_ids)[:, None])[:, 0]
        assert torch.allclose(full_T, torch.tensor(res.logprobs), atol=1e-4)


def test_concurrent_requests_share_forward_passes_and_honour_stops(bundle):
    prompts = _prompts(bundle, 6)
    plain = HFSampler(bundle.model)
    max_tokens = [10, 3, 10, 7, 10, 1]
    refs = [
        plain.generate(p, max_tokens=m, stop_token_ids=(), seed=i)
        for i, (p, m) in enumerate(zip(prompts, max_tokens, strict=True))
    ]
    # Even rows stop at their third sampled token: seeded tokens do not depend on batch-mates,
    # so the batched row must end at that token's first occurrence, stop token included.
    stops = [frozenset({refs[i].token_ids[2]}) if i % 2 == 0 else frozenset() for i in range(6)]
    requests = [
        SampleRequest(p, max_tokens=m, stop_token_ids=s, seed=i)
        for i, (p, m, s) in enumerate(zip(prompts, max_tokens, stops, strict=True))
    ]
    sampler = BatchedHFSampler(bundle.model, policy_version=7)
    results = asyncio.run(_gather(sampler, requests))
    assert sampler.stats.batches == 1 and sampler.stats.max_batch == 6
    assert sampler.stats.forward_calls <= max(max_tokens)  # not 6x: one forward per step
    for req, ref, res in zip(requests, refs, results, strict=True):
        assert res.policy_version == 7
        if req.stop_token_ids:
            cut = ref.token_ids.index(next(iter(req.stop_token_ids))) + 1
            assert res.token_ids == ref.token_ids[:cut] and res.finish_reason == "stop"
        else:
            assert res.token_ids == ref.token_ids and res.finish_reason == "length"
            assert len(res.token_ids) == req.max_tokens


def test_max_batch_size_caps_a_batch(bundle):
    sampler = BatchedHFSampler(bundle.model, max_batch_size=2)
    lengths = [2, 10, 2, 2, 2]  # the second row runs while the others take turns beside it
    requests = [
        SampleRequest(p, max_tokens=n, seed=i)
        for i, (p, n) in enumerate(zip(_prompts(bundle, 5), lengths, strict=True))
    ]
    results = asyncio.run(_gather(sampler, requests))
    assert [len(r.token_ids) for r in results] == lengths
    assert sampler.stats.max_batch == 2  # never more rows at once
    # the rows waiting took the finished rows' slots in the running batch
    assert sampler.stats.batches == 1 and sampler.stats.admitted == 3


def test_a_drained_batch_ends_and_the_queue_forms_the_next(bundle):
    """Turns join a batch while it runs; once every row has ended the batch is over, and what
    arrives next waits for the queue to gather it with whatever arrives alongside (a GRPO
    group's turns share a prefill then), not one batch per turn as each trickles in."""
    sampler = BatchedHFSampler(bundle.model)
    prompt = _prompts(bundle, 1)[0]
    asked = []

    def admit(room, fits):
        asked.append(fits)
        return [SampleRequest(prompt, max_tokens=2, seed=len(asked))] if len(asked) < 4 else []

    results = sampler._decode([SampleRequest(prompt, max_tokens=2, seed=0)], admit=admit)
    # each of 3 turns joined while the one before it ran (the 4th ask found none), then the
    # batch drained, and was not asked for more: the queue gathers the next batch
    assert len(results) == 4 and sampler.stats.admitted == 3
    assert len(asked) == 4 and None not in asked  # asked only while a row ran
    assert sampler.stats.forward_calls == 8  # a prefill per turn, 4 steps (one per 2nd token)


def test_a_failing_request_raises_to_its_caller_and_the_sampler_recovers(bundle):
    good_prompt = _prompts(bundle, 1)[0]
    bad = SampleRequest([*good_prompt, 10**7], max_tokens=4, seed=1)  # out-of-vocab token id
    good = SampleRequest(good_prompt, max_tokens=4, seed=2)
    sampler = BatchedHFSampler(bundle.model)

    async def episode():
        outcomes = await asyncio.gather(
            sampler.sample(bad), sampler.sample(good), sampler.sample(bad), return_exceptions=True
        )
        again = await sampler.sample(good)  # the worker survived the failure
        return outcomes, again

    (bad_1, good_res, bad_2), again = asyncio.run(asyncio.wait_for(episode(), timeout=20))
    assert isinstance(bad_1, IndexError) and isinstance(bad_2, IndexError)
    ref = HFSampler(bundle.model).generate(good_prompt, max_tokens=4, stop_token_ids=(), seed=2)
    assert good_res.token_ids == again.token_ids == ref.token_ids  # batch-mates unharmed


def test_a_broken_worker_fails_its_waiting_callers_instead_of_hanging_them(bundle):
    """Not a bad request (a batch answers those) but the worker loop itself raising: every
    caller waiting gets the error at once, and the next request starts a new worker."""
    sampler = BatchedHFSampler(bundle.model)
    request = SampleRequest(_prompts(bundle, 1)[0], max_tokens=3, seed=5)
    broken = {"left": 1}
    real = sampler._gather_stragglers

    async def gather_once_broken():
        if broken["left"]:
            broken["left"] -= 1
            raise OSError("the worker's own bug")
        await real()

    sampler._gather_stragglers = gather_once_broken

    async def episode():
        failed = await asyncio.gather(
            sampler.sample(request), sampler.sample(request), return_exceptions=True
        )
        return failed, await sampler.sample(request)

    failed, again = asyncio.run(asyncio.wait_for(episode(), timeout=20))
    assert all(isinstance(f, RuntimeError) for f in failed), failed
    assert all(isinstance(f.__cause__, OSError) for f in failed)
    ref = HFSampler(bundle.model).generate(
        request.prompt_ids, max_tokens=3, stop_token_ids=(), seed=5
    )
    assert again.token_ids == ref.token_ids


def test_the_sampler_works_across_event_loops(bundle):
    sampler = BatchedHFSampler(bundle.model)
    requests = [SampleRequest(p, max_tokens=5, seed=i) for i, p in enumerate(_prompts(bundle, 3))]
    first = asyncio.run(_gather(sampler, requests))
    sampler.policy_version = 1
    second = asyncio.run(asyncio.wait_for(_gather(sampler, requests), timeout=20))
    assert [r.token_ids for r in first] == [r.token_ids for r in second]
    assert {r.policy_version for r in first} == {0} and {r.policy_version for r in second} == {1}
    assert sampler.stats.batches == 2


def test_inverse_cdf_draws_follow_the_distribution_and_never_pick_impossible_tokens():
    from tracerl.rollout.sampler import draw

    probs = torch.tensor([0.1, 0.0, 0.6, 0.3, 0.0])
    u = torch.rand(40_000, generator=torch.Generator().manual_seed(0))
    logp = torch.log(probs).expand(len(u), -1)
    tokens = draw(logp, u)
    freq = torch.bincount(tokens, minlength=5).float() / len(u)
    assert torch.allclose(freq, probs, atol=0.01)
    assert freq[1] == 0 and freq[4] == 0  # zero-probability tokens are never drawn
    edges = draw(torch.log(probs)[None].expand(2, -1), torch.tensor([0.0, 1.0]))
    assert edges.tolist() == [0, 3]  # the first and the last possible tokens


def test_rows_that_stop_early_leave_the_batch_without_changing_the_others(bundle):
    prompts = _prompts(bundle, 4)
    probe = HFSampler(bundle.model, temperature=1.0)
    first = probe.generate(prompts[0], max_tokens=1, stop_token_ids=(), seed=7).token_ids[0]
    # request 0 stops on its first token; the others run 10 tokens
    requests = [
        SampleRequest(prompts[0], max_tokens=10, stop_token_ids=frozenset({first}), seed=7),
        *(SampleRequest(p, max_tokens=10 - i, seed=20 + i) for i, p in enumerate(prompts[1:])),
    ]
    sampler = BatchedHFSampler(bundle.model, temperature=1.0)
    results = sampler.generate_batch(requests)
    assert results[0].token_ids == [first] and results[0].finish_reason == "stop"
    for req, res in zip(requests[1:], results[1:], strict=True):
        alone = probe.generate(
            req.prompt_ids, max_tokens=req.max_tokens, stop_token_ids=(), seed=req.seed
        )
        assert res.token_ids == alone.token_ids and len(res.token_ids) == req.max_tokens
        assert torch.allclose(torch.tensor(res.logprobs), torch.tensor(alone.logprobs), atol=1e-4)


def test_identical_prompts_are_prefilled_once_and_still_sampled_independently(bundle):
    prompts = _prompts(bundle, 2)
    # a group: four members of one prompt, three of another, different seeds
    requests = [SampleRequest(prompts[i // 4], max_tokens=8, seed=50 + i) for i in range(7)]
    sampler = BatchedHFSampler(bundle.model, temperature=1.0)
    results = sampler.generate_batch(requests)
    assert sampler.stats.shared_prefills == 5  # 7 requests, 2 distinct prompts
    plain = HFSampler(bundle.model, temperature=1.0)
    for req, res in zip(requests, results, strict=True):
        ref = plain.generate(req.prompt_ids, max_tokens=8, stop_token_ids=(), seed=req.seed)
        assert res.token_ids == ref.token_ids
        assert torch.allclose(torch.tensor(res.logprobs), torch.tensor(ref.logprobs), atol=1e-4)
    assert len({tuple(r.token_ids) for r in results}) > 2  # members differ: own seeds


# What both samplers drew for these seeded requests before sampling moved onto the model's
# device (recorded from the CPU-side loop): the move keeps a seeded turn's tokens.
SEEDED = [
    ((1, 42, 7, 99, 5), 3, [206, 5171, 14040, 1324, 23184, 2947, 37912, 36535, 29222, 43624]),
    ((1, 9, 8), 11, [7315, 23917, 48444, 8267, 28701, 34060, 28665, 6294, 28091, 45438]),
]


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "plain"])
def test_seeded_requests_draw_the_tokens_they_always_drew(bundle, batched):
    requests = [SampleRequest(p, 10, frozenset(), seed=s) for p, s, _ in SEEDED]
    if batched:
        got = BatchedHFSampler(bundle.model, seed=0).generate_batch(requests)
    else:
        plain = HFSampler(bundle.model, seed=0)
        got = [asyncio.run(plain.sample(r)) for r in requests]
    assert [r.token_ids for r in got] == [want for _, _, want in SEEDED]
    # each token's log-prob is the one its step's distribution gives it (and a host float)
    assert all(isinstance(x, float) and x < 0 for r in got for x in r.logprobs)


def test_a_decode_step_reads_back_from_the_device_once(bundle, monkeypatch):
    """Sampling happens where the logits are: a step's tokens and log-probs come back to
    the host in one read (on a GPU, one sync per step), not a logits copy and a read per
    row."""
    reads = []
    for name in ("cpu", "tolist", "item", "__int__", "__float__"):
        original = getattr(torch.Tensor, name)

        def counted(self, *a, _original=original, _name=name, **k):
            reads.append(_name)
            return _original(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, counted)
    requests = [SampleRequest((1, 42, 7, 99, 5), 12, frozenset(), seed=b) for b in range(4)]
    out = BatchedHFSampler(bundle.model, seed=0).generate_batch(requests)
    monkeypatch.undo()
    assert all(len(r.token_ids) == 12 for r in out)
    assert len(reads) <= 12 + 2, reads  # a read per decode step, and little else


def test_a_turn_that_arrives_mid_batch_joins_it_and_draws_its_own_tokens(bundle):
    """Continuous batching: a request made while a batch decodes joins it at the next step
    (its own prompt prefilled, the running rows left-padded to match) instead of waiting
    for the batch to drain; a finished row's caller gets its turn at once; every seeded
    row's tokens are the ones it draws alone."""
    prompts = _prompts(bundle, 3)
    plain = HFSampler(bundle.model)
    alone = [plain.generate(p, max_tokens=m, stop_token_ids=(), seed=i)
             for i, (p, m) in enumerate(zip(prompts, [24, 4, 12], strict=True))]  # fmt: skip
    sampler = BatchedHFSampler(bundle.model, max_batch_size=4)
    order: list[str] = []
    calls: list[int] = []
    # the short row (4 tokens) answered two steps before the 7th forward
    _pace(sampler, lambda: calls.append(1) or len(calls) == 7)

    async def run():
        async def ask(name, i, m, delay=0):
            await asyncio.sleep(delay)
            r = await sampler.sample(SampleRequest(prompts[i], max_tokens=m, seed=i))
            order.append(name)
            return r

        long = asyncio.create_task(ask("long", 0, 24))
        short = asyncio.create_task(ask("short", 1, 4))
        first_short = await short  # answered while the long row still decodes
        # a later turn (as an episode's next turn would be) joins the running batch
        late = await ask("late", 2, 12)
        return await long, first_short, late

    long, short, late = asyncio.run(run())
    assert order == ["short", "late", "long"]
    assert sampler.stats.batches == 1 and sampler.stats.admitted == 1
    for got, ref in zip([long, short, late], alone, strict=True):
        assert got.token_ids == ref.token_ids
        assert torch.allclose(torch.tensor(got.logprobs), torch.tensor(ref.logprobs), atol=1e-4)


def test_static_batching_is_still_there_to_compare_with(bundle):
    """`continuous = False`: waiting requests wait for the running batch to drain."""
    sampler = BatchedHFSampler(bundle.model, max_batch_size=2)
    sampler.continuous = False
    requests = [SampleRequest(p, max_tokens=2, seed=i) for i, p in enumerate(_prompts(bundle, 5))]
    results = asyncio.run(_gather(sampler, requests))
    assert [r.token_ids for r in results] == [
        r.token_ids for r in BatchedHFSampler(bundle.model).generate_batch(requests)
    ]
    assert sampler.stats.batches == 3 and sampler.stats.admitted == 0


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "plain"])
def test_under_bf16_mixed_a_turn_casts_the_weights_once(batched, monkeypatch):
    """fp32 master weights under autocast: one autocast region spans a whole turn (a
    batch), so each weight is cast to bf16 once and reused by every decode step; autocast
    drops its cast cache only when that region ends."""
    from tracerl.models.placement import place, resolve

    model = place(load("tiny-random").model, resolve("cpu", "auto", "bf16-mixed"))
    dropped = []
    clear = torch.clear_autocast_cache
    monkeypatch.setattr(torch, "clear_autocast_cache", lambda: (dropped.append(1), clear()))
    request = SampleRequest((1, 42, 7, 99, 5), 8, frozenset(), seed=3)
    if batched:
        (out,) = BatchedHFSampler(model, seed=0).generate_batch([request])
    else:
        out = asyncio.run(HFSampler(model, seed=0).sample(request))
    assert len(out.token_ids) == 8
    assert len(dropped) == 1  # one region for 8 decode steps (it was one per forward)
