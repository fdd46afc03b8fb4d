"""FaultInjector is reproducible; the batching sampler changes no episode's tokens."""

from __future__ import annotations

import asyncio

from tests.scripts import scripted_policy
from tracerl.envs import FaultInjector, get_parser, make
from tracerl.rollout import BatchedHFSampler, HFSampler
from tracerl.rollout.budget import Budgets, RolloutConfig
from tracerl.rollout.groups import run_group
from tracerl.rollout.runner import Policy


def _faults(tiny, seed):
    injectors = []

    def env():
        injectors.append(FaultInjector(make("refund_desk"), rate=0.5, seed=seed))
        return injectors[-1]

    tasks = make("refund_desk").sample_tasks(3, seed=0)
    for task in tasks:
        asyncio.run(run_group(env, task, scripted_policy(tiny.renderer, tasks), group_size=4))
    return sorted((i["task_id"], i["step"], i["kind"]) for inj in injectors for i in inj.injected)


def test_same_seed_same_faults_different_seed_different_faults(tiny):
    first, again, other = _faults(tiny, 3), _faults(tiny, 3), _faults(tiny, 4)
    assert first == again and len(first) >= 5
    assert first != other


def test_injected_latency_is_heavy_tailed_and_slow_calls_become_timeouts():
    inj = FaultInjector(make("refund_desk"), rate=1.0, kinds=["latency"], latency_scale_ms=100)
    draws = sorted(100 * inj.rng.paretovariate(inj.latency_alpha) for _ in range(2000))
    median, p99 = draws[1000], draws[1980]
    assert p99 > 10 * median  # a heavy tail, not jitter
    task = make("refund_desk").sample_tasks(1)[0]
    action = get_parser("json_list").parse(
        '<tool_call>[{"name": "get_refund_policy", "arguments": {}}]</tool_call>', step=0
    )
    kinds = []
    for seed in range(40):
        asyncio.run(inj.reset(task, seed))
        result = asyncio.run(inj.step(action))
        kinds.append(result.calls[0].fault.kind.value if result.calls[0].fault else "ok")
    # The tool's 5 s timeout: most delays pass, the tail becomes timeouts.
    assert "ok" in kinds and "timeout" in kinds


def test_batched_sampler_episodes_equal_plain_sampler_episodes(tiny):
    """The fast path changes nothing: same seeds, same episodes, token for token."""
    cfg = RolloutConfig(budgets=Budgets(steps=2), max_turn_tokens=12)
    task = make("refund_desk").sample_tasks(1, seed=2)[0]

    def run(sampler):
        policy = Policy.from_bundle(tiny, sampler)
        return asyncio.run(run_group("refund_desk", task, policy, cfg, group_size=4, seed=5))

    batched = BatchedHFSampler(tiny.model, temperature=1.0)
    plain = run(HFSampler(tiny.model, temperature=1.0))
    fast = run(batched)
    assert batched.stats.max_batch == 4
    for a, b in zip(plain, fast, strict=True):
        assert a.trajectories[0].token_ids == b.trajectories[0].token_ids
        assert a.trajectories[0].loss_mask == b.trajectories[0].loss_mask
        assert a.stop_reason is b.stop_reason


def test_a_fault_injector_does_not_change_the_prompt_of_the_env_it_wraps():
    from tracerl.envs import FaultInjector, make

    for protocol in ("tools", "search_r1"):  # Search-R1's tags describe tools in words
        env = make("search", corpus="synthetic", protocol=protocol)
        assert FaultInjector(env, rate=1.0).tool_schemas() == env.tool_schemas()
    assert make("search", corpus="synthetic", protocol="search_r1").tool_schemas() == []
