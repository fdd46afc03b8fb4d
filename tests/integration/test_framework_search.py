"""The LangGraph Search-R1 agent (`examples/search_r1_langgraph.py`, no tracerl import) trains
with a warm start played through the agent itself: the environment's reference searches and
answers are the model's turns, sent through the gateway; the agent runs its own retrieval
(a Search-R1 retrieval server) and its results are environment tokens, never trained on.
This is the run `benchmarks/framework_smollm2.py` measures on SmolLM2, on a tiny model."""

from __future__ import annotations

import json

import pytest

from tracerl.config.loading import load_config
from tracerl.envs.search.corpus import load_corpus
from tracerl.envs.search.server import RetrievalServer
from tracerl.rollout.persist import read_run_trajectories
from tracerl.train.loop import train
from tracerl.types import Source

ARGS = [
    "model.spec=tiny-random",
    "warm_start.tasks=6",
    "trainer.steps=2",
    "trainer.group_size=2",
    "env.tasks_per_step=2",
    "env.eval_tasks=4",
    "trainer.eval_every=0",
    "trainer.micro_batch_tokens=1024",
]


@pytest.fixture
def retriever(monkeypatch):
    pytest.importorskip("langgraph")
    with RetrievalServer(load_corpus("synthetic")) as server:
        monkeypatch.setenv("RETRIEVER_URL", server.url)
        yield server


def test_the_langgraph_search_agent_warm_starts_and_trains_through_the_gateway(tmp_path, retriever):
    cfg = load_config("examples/search_r1_langgraph.yaml", [f"out_dir={tmp_path}", *ARGS])
    train(cfg, log=lambda _: None)
    run = cfg.run_dir
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    (ws,) = [r for r in rows if r["phase"] == "warm_start"]
    # the reference, played through the agent, answers every question right
    assert ws["warm_start/kept"] == ws["warm_start/episodes"] == 6
    assert ws["warm_start/nll_after"] < ws["warm_start/nll_before"]
    warm = [t for _, t in read_run_trajectories(run / "warm_start")]
    assert len(warm) == 6
    for t in warm:
        assert t.receipt["agent"]["protocols"] == ["openai-chat"]
        assert t.receipt["stop_reason"] == "answered"
        trained = [s.text for s in t.policy_segments()]
        # the reference's turns are the only loss: its searches, then its answer
        assert trained[-1] == f"<answer>{t.receipt['task']['answers'][0]}</answer><|im_end|>"
        assert all(x.startswith("<search>") for x in trained[:-1]) and len(trained) >= 2
        # the agent's retrieval came back as environment tokens, as the agent wrote it
        observed = [s.text for s in t.segments if s.source is Source.ENVIRONMENT]
        assert observed and all(x.startswith("<information>Doc 1 (title ") for x in observed)
        assert not any("<information>" in x for x in trained)
    assert [r["phase"] for r in rows].count("train") == 2
    steps = [t for _, t in read_run_trajectories(run)]
    assert len(steps) == 2 * 2 * 2 and all(t.receipt["agent"] for t in steps)
