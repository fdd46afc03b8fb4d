"""Each real agent framework (`tests/frameworks/`, unmodified, no tracerl import) trains a
tiny model for two steps with `tracerl train`, as a user would run it: the calculator
example's task and reward, only the ``agent`` entry changed. Every episode is the policy's
(gradient-eligible), and each speaks its framework's protocol."""

from __future__ import annotations

import pytest

from tests.integration.test_gateway_training import metrics, tracerl
from tracerl.rollout.persist import read_run_trajectories

FRAMEWORKS = [
    ("openai_agents_sdk", "agents", "openai-responses"),
    ("anthropic_sdk", "anthropic", "anthropic-messages"),
    ("langgraph_agent", "langgraph", "openai-chat"),
    ("pydantic_ai_agent", "pydantic_ai", "openai-chat"),
]


@pytest.mark.parametrize(("module", "package", "protocol"), FRAMEWORKS)
def test_a_framework_agent_trains_unmodified(tmp_path, module, package, protocol):
    pytest.importorskip(package)
    entry = f"tests.frameworks.{module}:solve"
    tracerl(
        "train", "examples/calculator_agent.yaml", f"out_dir={tmp_path}", f"agent={entry}",
        "trainer.steps=2", "trainer.group_size=4", "env.eval_tasks=2",
    )  # fmt: skip
    run = tmp_path / "calculator-agent"
    steps = metrics(run)
    assert len(steps) == 2
    assert all(m["train/loss"] == m["train/loss"] for m in steps)  # a number: it updated
    trajectories = [t for _, t in read_run_trajectories(run)]
    train = [t for t in trajectories if t.receipt["agent"]["entry"] == entry]
    assert len(train) >= 2 * 4 * 4  # 2 steps of 4 tasks x 4 episodes
    assert all(t.receipt["agent"]["protocols"] == [protocol] for t in train)
    # whatever the random model wrote, the framework ended and the episode is the policy's
    assert sum(m["rollout/gradient_eligible_rate"] for m in steps) / 2 > 0.9, steps
