"""A multi-turn episode sampled from a (tiny, random) model: provenance under real sampling.

A random model samples arbitrary token ids, special tokens included, that rarely survive a
decode/re-encode round trip: exactly the case where re-tokenizing would corrupt masks.
"""

from __future__ import annotations

from tracerl.models import load
from tracerl.rollout import HFSampler
from tracerl.types import Source, ToolCall


def test_random_samples_are_kept_verbatim_across_turns():
    bundle = load("tiny-random")
    sampler = HFSampler(bundle.model, temperature=1.0, seed=3)
    conv = bundle.renderer.start([{"role": "user", "content": "Say something."}])
    results = []
    for step in range(3):
        res = sampler.generate(conv.token_ids, max_tokens=20, stop_token_ids={2})
        results.append(res)
        conv.add_policy(
            res.token_ids,
            res.logprobs,
            finish_reason=res.finish_reason,
            tool_calls=[ToolCall(f"c{step}", "noop", {})],
        )
        conv.add_observation([{"role": "tool", "tool_call_id": f"c{step}", "content": "ok"}])
    traj = conv.trajectory()
    policy = traj.policy_segments()
    assert [list(s.token_ids) for s in policy] == [r.token_ids for r in results]
    assert [list(s.logprobs) for s in policy] == [r.logprobs for r in results]
    trained = [t for t, m in zip(traj.token_ids, traj.loss_mask, strict=True) if m]
    assert trained == [t for r in results for t in r.token_ids]
    assert all(
        m == 0
        for m, src in zip(traj.loss_mask, traj.sources, strict=True)
        if src in (Source.ENVIRONMENT, Source.ECHO, Source.TEMPLATE, Source.PROMPT)
    )
    # The sampler continued from exactly these tokens: the prompt of turn k+1 is the whole
    # trajectory so far, so re-feeding it reproduces the recorded logprob of the first token.
    assert all(lp <= 0 for r in results for lp in r.logprobs)


def test_cached_sampling_logprobs_equal_a_full_forward_pass():
    """The KV-cached sampler's logprobs are those of the distribution actually sampled from:
    recomputing them with one plain forward pass over prompt + sample gives the same numbers."""
    import torch

    bundle = load("tiny-random")
    temperature = 0.7
    sampler = HFSampler(bundle.model, temperature=temperature, seed=5)
    prompt = bundle.renderer.start([{"role": "user", "content": "Count."}]).token_ids
    res = sampler.generate(prompt, max_tokens=12, stop_token_ids=set())
    assert res.finish_reason == "length" and len(res.token_ids) == 12
    with torch.no_grad():
        logits_T_V = bundle.model(torch.tensor([prompt + res.token_ids])).logits[0]
    logp_T_V = torch.log_softmax(logits_T_V[len(prompt) - 1 : -1] / temperature, dim=-1)
    full = logp_T_V.gather(1, torch.tensor(res.token_ids)[:, None])[:, 0]
    assert torch.allclose(full, torch.tensor(res.logprobs), atol=1e-4)
