"""Real agent frameworks, unmodified (`tests/frameworks/`, no tracerl import), through the
gateway: a scripted tool call runs the framework's own tool, the framework's loop sends
the result back, and the episode is the policy's, with the tool result the environment's
tokens (no loss) and the policy tokens exactly what the sampler returned."""

from __future__ import annotations

import pytest

from tests.unit.test_gateway import CALL, sampled_only, scripted, via_gateway
from tracerl.models import load
from tracerl.types import Attribution, Source, StopReason

FRAMEWORKS = [
    ("openai_agents_sdk", "agents", "openai-responses"),
    ("anthropic_sdk", "anthropic", "anthropic-messages"),
    ("langgraph_agent", "langgraph", "openai-chat"),
    ("pydantic_ai_agent", "pydantic_ai", "openai-chat"),
]


@pytest.fixture(scope="module")
def bundle():
    return load("tiny-random")


@pytest.mark.parametrize(("module", "package", "protocol"), FRAMEWORKS)
def test_a_framework_agent_runs_its_tool_loop_through_the_gateway(
    bundle, module, package, protocol
):
    pytest.importorskip(package)
    episode = via_gateway(f"tests.frameworks.{module}:solve", scripted(bundle, {0: CALL, 1: "5"}))
    assert episode.stop_reason is StopReason.ANSWERED, episode.receipt.error
    assert episode.attribution is Attribution.POLICY and episode.gradient_eligible
    assert episode.steps[-1]["info"]["answer"] == "5"
    agent = episode.receipt.agent
    assert agent["protocols"] == [protocol]
    assert agent["requests"] == 2 and agent["history_breaks"] == []
    [t] = episode.trajectories
    # the framework ran its own add tool on the model's call; its result is the env's
    assert "".join(s.text for s in t.segments if s.source is Source.ENVIRONMENT) == "5"
    assert episode.steps[0]["calls"][0]["action"] == {"tool": "add", "args": {"a": 2, "b": 3}}
    sampled_only(episode)
    policy = "".join(s.text for s in t.segments if s.source is Source.POLICY)
    assert policy.startswith(CALL) and policy.count("5") >= 1


def test_an_earlier_episodes_client_closing_on_a_later_loop_is_not_reported():
    """LangChain caches one HTTP client per base URL and, when the cache evicts one, closes
    it on whatever loop runs then (a later episode's): "Event loop is closed" is expected
    there and logged at debug level; any other unretrieved error is still reported."""
    import asyncio

    from tracerl.gateway.harness import _quiet_foreign_close

    class Client:
        async def aclose(self):
            raise RuntimeError("Event loop is closed")

    async def work():
        raise RuntimeError("Event loop is closed")

    reported = []
    loop = asyncio.new_event_loop()
    loop.default_exception_handler = reported.append
    try:
        for coro, expected in ((Client().aclose(), 0), (work(), 1)):
            task = loop.create_task(coro)
            loop.run_until_complete(asyncio.wait([task]))
            context = {"message": "Task exception was never retrieved", "task": task}
            _quiet_foreign_close(loop, {**context, "exception": task.exception()})
            assert len(reported) == expected
    finally:
        loop.close()
