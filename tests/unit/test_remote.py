"""Remote sampling over the OpenAI-compatible completion protocol, end to end on loopback:
`tracerl serve`'s server and `RemoteSampler` give the tokens and log-probs the in-process
sampler gives for the same seeds, and a server that is down is the environment's failure."""

from __future__ import annotations

import asyncio
import copy

import pytest

from tests.serve import tracerl_serve
from tracerl.envs import get_parser, make
from tracerl.rollout import BatchedHFSampler
from tracerl.rollout.budget import Budgets, RolloutConfig
from tracerl.rollout.remote import RemoteSampler
from tracerl.rollout.runner import Policy, run_episode
from tracerl.rollout.sampler import SampleRequest, SamplerUnavailable
from tracerl.rollout.serve import CompletionServer
from tracerl.types import Attribution, StopReason

ROLLOUT = RolloutConfig(budgets=Budgets(steps=2), max_turn_tokens=12, reserve=None)


async def _served(tiny, fn, server_cls=CompletionServer, temperature=1.0):
    """Run `fn(remote_sampler)` against a live server on an ephemeral loopback port."""
    local = BatchedHFSampler(copy.deepcopy(tiny.model), temperature=1.0, seed=0)
    server = server_cls(local, "tiny-random", tiny.tokenizer)
    port = await server.start("127.0.0.1", 0)
    remote = RemoteSampler(
        f"http://127.0.0.1:{port}", "tiny-random", temperature=temperature, backoff_s=0.01
    )
    try:
        return await fn(remote), server
    finally:
        await remote.close()
        await server.stop()


def test_remote_tokens_and_logprobs_equal_the_in_process_samplers(tiny):
    stop = frozenset(tiny.renderer.stop_token_ids)
    requests = [SampleRequest((1, 2, 3, 4 + i), 8, stop, seed=100 + i) for i in range(3)]

    async def many(remote):  # one at a time: a batch of one on both sides
        return [await remote.sample(r) for r in requests]

    remote_results, _ = asyncio.run(_served(tiny, many))
    local = BatchedHFSampler(copy.deepcopy(tiny.model), temperature=1.0, seed=0)
    for r, got in zip(requests, remote_results, strict=True):
        want = local.generate_batch([r])[0]
        assert got.token_ids == want.token_ids and got.finish_reason == want.finish_reason
        assert got.logprobs == pytest.approx(want.logprobs, abs=1e-5)


def test_an_episode_through_the_server_equals_the_in_process_one(tiny):
    task = make("refund_desk").sample_tasks(1)[0]
    parser = get_parser("json_list")

    async def remote_episode(remote):
        policy = Policy(remote, tiny.renderer, parser, "tiny-random")
        return await run_episode(make("refund_desk"), task, policy, ROLLOUT, seed=7)

    remote_e, _ = asyncio.run(_served(tiny, remote_episode))
    local = BatchedHFSampler(copy.deepcopy(tiny.model), temperature=1.0, seed=0)
    policy = Policy(local, tiny.renderer, parser, "tiny-random")
    local_e = asyncio.run(run_episode(make("refund_desk"), task, policy, ROLLOUT, seed=7))
    a, b = remote_e.trajectories[0], local_e.trajectories[0]
    assert a.token_ids == b.token_ids and a.loss_mask == b.loss_mask and a.sources == b.sources
    assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    assert remote_e.stop_reason == local_e.stop_reason


def test_a_server_that_is_down_is_an_infrastructure_failure(tiny):
    remote = RemoteSampler("http://127.0.0.1:9", "m", retries=1, backoff_s=0.01, timeout_s=2)
    with pytest.raises(SamplerUnavailable, match="2 attempts failed"):
        asyncio.run(remote.sample(SampleRequest((1, 2), 4)))
    task = make("refund_desk").sample_tasks(1)[0]
    policy = Policy(remote, tiny.renderer, get_parser("json_list"), "tiny-random")
    e = asyncio.run(run_episode(make("refund_desk"), task, policy, ROLLOUT))
    assert e.stop_reason is StopReason.INFRA_FAILURE
    assert e.attribution is Attribution.ENVIRONMENT and not e.gradient_eligible


def test_an_overloaded_server_is_retried(tiny):
    class Flaky(CompletionServer):
        fails = 2

        async def handle(self, method, path, body):
            if path == "/v1/completions" and Flaky.fails:
                Flaky.fails -= 1
                return 503, {"error": {"message": "overloaded"}}
            return await super().handle(method, path, body)

    async def one(remote):
        return await remote.sample(SampleRequest((1, 2, 3), 4, seed=1))

    result, server = asyncio.run(_served(tiny, one, Flaky))
    assert result.token_ids and Flaky.fails == 0 and server.served == 1


def test_a_request_the_server_cannot_honour_is_a_configuration_error(tiny):
    async def one(remote):
        return await remote.sample(SampleRequest((1, 2, 3), 4, seed=1))

    with pytest.raises(ValueError, match=r"samples at temperature 1\.0, not 0\.5"):
        asyncio.run(_served(tiny, one, temperature=0.5))


def test_tracerl_serve_answers_a_remote_sampler(tiny):
    with tracerl_serve("tiny-random") as url:
        remote = RemoteSampler(url, "tiny-random")

        async def one():
            try:
                return await remote.sample(SampleRequest((1, 2, 3), 5, seed=3))
            finally:
                await remote.close()

        got = asyncio.run(one())
    want = BatchedHFSampler(tiny.model, temperature=1.0).generate_batch(
        [SampleRequest((1, 2, 3), 5, seed=3)]
    )[0]
    assert got.token_ids == want.token_ids
