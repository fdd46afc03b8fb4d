"""Multi-turn trajectories sampled from a real (tiny) model: policy turns with the sampler's
own log-probs, tool output and template scaffolding between them — what a teacher or a
learner is given, without an environment."""

from __future__ import annotations

from tracerl.rollout import HFSampler
from tracerl.types import ToolCall


def sampled_trajectories(bundle, temperature, *, seed, n=3, turns=3, tokens=lambda k: 8):
    """`n` trajectories of `turns` policy turns each (`tokens(k)` tokens a turn in the k-th),
    every turn a tool call answered by a tool message."""
    sampler = HFSampler(bundle.model, temperature=temperature, seed=seed)
    out = []
    for k in range(n):
        conv = bundle.renderer.start([{"role": "user", "content": f"Task {k}: look it up."}])
        for step in range(turns):
            res = sampler.generate(conv.token_ids, max_tokens=tokens(k), stop_token_ids=set())
            conv.add_policy(
                res.token_ids,
                res.logprobs,
                finish_reason=res.finish_reason,
                tool_calls=[ToolCall(f"c{step}", "lookup", {})],
            )
            conv.add_observation(
                [{"role": "tool", "tool_call_id": f"c{step}", "content": f"result {k}.{step}"}]
            )
        out.append(conv.trajectory())
    return out
