"""Prefix caching across turns: an episode's next turn prefills only what its last turn did not
already run through the model, and draws what a full prefill would draw."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import threading

import pytest
import torch

from tracerl.rollout import BatchedHFSampler, HFSampler, SampleRequest
from tracerl.rollout.prefix_cache import PrefixStore, common_prefix, store_bytes

from .test_batched_sampler import _pace, _prompts, bundle  # noqa: F401  (the fixture)

TOOL = (17, 23, 99, 4, 4, 31, 8, 250, 12)  # a tool's answer and the template's tokens


def _fed(sampler: BatchedHFSampler) -> list[tuple[int, int]]:
    """The (rows, tokens) of every forward `sampler` runs."""
    shapes: list[tuple[int, int]] = []
    forward = sampler._forward

    def counted(ids_B_T, *a, **k):
        shapes.append(tuple(ids_B_T.shape))
        return forward(ids_B_T, *a, **k)

    sampler._forward = counted
    return shapes


def _alone(model, request: SampleRequest):
    return HFSampler(model).generate(
        request.prompt_ids,
        max_tokens=request.max_tokens,
        stop_token_ids=request.stop_token_ids,
        seed=request.seed,
    )


def _same(got, ref) -> None:
    assert got.token_ids == ref.token_ids
    assert torch.allclose(torch.tensor(got.logprobs), torch.tensor(ref.logprobs), atol=1e-4)


def test_an_episodes_next_turn_prefills_only_what_is_new(bundle):  # noqa: F811
    sampler = BatchedHFSampler(bundle.model)
    fed = _fed(sampler)
    p1 = _prompts(bundle, 1)[0]
    r1 = sampler.generate_batch([SampleRequest(p1, 10, frozenset(), seed=1, episode_id="e")])[0]
    p2 = (*p1, *r1.token_ids, *TOOL)
    fed.clear()
    turn2 = SampleRequest(p2, 10, frozenset(), seed=2, episode_id="e")
    r2 = sampler.generate_batch([turn2])[0]
    kept = len(p1) + len(r1.token_ids) - 1  # the last sampled token was never fed
    assert fed[0] == (1, len(p2) - kept)  # the prefill: the last token and the tool's answer
    assert sampler.prefixes.stats.reused_tokens == kept
    _same(r2, _alone(bundle.model, turn2))


def test_rows_with_and_without_kept_prefixes_share_a_batch(bundle):  # noqa: F811
    """One batch of: two episodes' next turns (new parts of different lengths), a turn whose
    context was compacted (only its start is still the last turn's), a new episode, and a
    request without an episode. Each draws what it draws alone."""
    sampler = BatchedHFSampler(bundle.model)
    prompts = _prompts(bundle, 3)
    first = sampler.generate_batch(
        [
            SampleRequest(p, 6, frozenset(), seed=i, episode_id=f"e{i}")
            for i, p in enumerate(prompts)
        ]
    )
    seq = [(*p, *r.token_ids) for p, r in zip(prompts, first, strict=True)]
    nxt = [
        SampleRequest((*seq[0], *TOOL), 8, frozenset(), seed=10, episode_id="e0"),
        SampleRequest((*seq[1], *TOOL, *TOOL, 5), 8, frozenset(), seed=11, episode_id="e1"),
        SampleRequest((*seq[2][:7], 301, 302, 303), 8, frozenset(), seed=12, episode_id="e2"),
        SampleRequest(prompts[1], 8, frozenset(), seed=13, episode_id="new"),
        SampleRequest(prompts[2], 8, frozenset(), seed=14),
    ]
    fed = _fed(sampler)
    got = sampler.generate_batch(nxt)
    stats = sampler.prefixes.stats
    assert stats.hits == 3
    assert stats.reused_tokens == len(seq[0]) - 1 + len(seq[1]) - 1 + 7
    assert fed[0][0] == 5 and fed[0][1] < max(len(r.prompt_ids) for r in nxt)
    for request, result in zip(nxt, got, strict=True):
        _same(result, _alone(bundle.model, request))


def test_a_turn_joining_a_running_batch_starts_from_its_kept_prefix(bundle):  # noqa: F811
    """Continuous batching and prefix caching together: an episode's next turn joins a
    batch still decoding another row, prefilling only its new tokens."""
    prompts = _prompts(bundle, 2)
    sampler = BatchedHFSampler(bundle.model, max_batch_size=4)
    turn1_done = threading.Event()
    _pace(sampler, turn1_done.is_set)  # however busy the machine: the next turn joins
    long_req = SampleRequest(prompts[0], 30, frozenset(), seed=1, episode_id="long")

    async def run():
        long = asyncio.create_task(sampler.sample(long_req))
        r1 = await sampler.sample(SampleRequest(prompts[1], 3, frozenset(), seed=2, episode_id="e"))
        turn1_done.set()
        turn2 = SampleRequest((*prompts[1], *r1.token_ids, *TOOL), 5, frozenset(), seed=3,
                              episode_id="e")  # fmt: skip
        r2 = await sampler.sample(turn2)
        return await long, turn2, r2

    long, turn2, r2 = asyncio.run(asyncio.wait_for(run(), timeout=120))
    assert sampler.stats.batches == 1 and sampler.stats.admitted == 1
    assert sampler.prefixes.stats.hits == 1
    _same(r2, _alone(bundle.model, turn2))
    _same(long, _alone(bundle.model, long_req))


@pytest.mark.parametrize("change", ["policy_version", "weights_lock"])
def test_new_weights_never_start_from_old_keys_and_values(bundle, change):  # noqa: F811
    """After an update (the loops bump ``policy_version``; an async learner or a weight sync
    holds the weights lock to write) the next turn prefills its whole prompt on the new
    weights: its tokens are the new weights' own."""
    model = copy.deepcopy(bundle.model)
    sampler = BatchedHFSampler(model)
    p1 = _prompts(bundle, 1)[0]
    r1 = sampler.generate_batch([SampleRequest(p1, 8, frozenset(), seed=1, episode_id="e")])[0]
    writer = sampler._model_lock if change == "weights_lock" else contextlib.nullcontext()
    with writer, torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    if change == "policy_version":
        sampler.policy_version += 1
    turn2 = SampleRequest((*p1, *r1.token_ids, *TOOL), 8, frozenset(), seed=2, episode_id="e")
    r2 = sampler.generate_batch([turn2])[0]
    assert sampler.prefixes.stats.hits == 0 and sampler.prefixes.stats.cleared == 1
    _same(r2, _alone(model, turn2))


def test_an_ended_episode_leaves_nothing_kept(bundle):  # noqa: F811
    """The rollout runner tells the sampler when an episode ends: its last turn's keys and
    values (which no turn will take) are dropped, so the store is empty between steps."""
    from tracerl.envs import get_parser, make
    from tracerl.rollout.budget import Budgets, RolloutConfig
    from tracerl.rollout.runner import Policy, run_episode

    sampler = BatchedHFSampler(bundle.model)
    policy = Policy(sampler, bundle.renderer, get_parser("json_list"), "tiny-random")
    env = make("refund_desk")
    task = env.sample_tasks(1)[0]
    rollout = RolloutConfig(budgets=Budgets(steps=2), max_turn_tokens=8)
    asyncio.run(run_episode(env, task, policy, rollout, seed=3, episode_id="ep"))
    assert sampler.prefixes.stats.stored >= 1
    assert len(sampler.prefixes) == 0 and sampler.prefixes.bytes == 0


def test_a_turn_no_other_can_follow_is_never_kept(bundle):  # noqa: F811
    """A step budget's last turn (every turn of a single-turn task: GRPO on math) asks the
    sampler to keep nothing: no copy of its rows' keys and values is made, only to be dropped
    when its episode ends."""
    from tracerl.envs import get_parser, make
    from tracerl.rollout.budget import Budgets, RolloutConfig
    from tracerl.rollout.runner import Policy, run_episode

    sampler = BatchedHFSampler(bundle.model)
    policy = Policy(sampler, bundle.renderer, get_parser("json_list"), "tiny-random")
    env = make("arithmetic")
    rollout = RolloutConfig(budgets=Budgets(steps=1), max_turn_tokens=4, reserve=None)
    for i, task in enumerate(env.sample_tasks(3)):
        asyncio.run(run_episode(make("arithmetic"), task, policy, rollout, seed=i))
    assert sampler.stats.requests == 3 and sampler.prefixes.stats.stored == 0


def test_static_slots_and_a_zero_cap_keep_nothing(bundle):  # noqa: F811
    p1 = _prompts(bundle, 1)[0]
    for sampler in (
        BatchedHFSampler(bundle.model, kv_cache="static"),
        BatchedHFSampler(bundle.model, prefix_cache_gb=0),
    ):
        r1 = sampler.generate_batch([SampleRequest(p1, 4, frozenset(), seed=1, episode_id="e")])
        turn2 = SampleRequest((*p1, *r1[0].token_ids, *TOOL), 4, frozenset(), seed=2,
                              episode_id="e")  # fmt: skip
        _same(sampler.generate_batch([turn2])[0], _alone(bundle.model, turn2))
        assert sampler.prefixes.stats.stored == 0 and sampler.prefixes.stats.hits == 0
    with pytest.raises(ValueError, match="prefix_cache_gb"):
        BatchedHFSampler(bundle.model, prefix_cache_gb=-1)


def _layers(n: int, layers: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.zeros(1, n, 4), torch.zeros(1, n, 4)) for _ in range(layers)]  # 64n bytes


def test_the_store_stays_under_its_cap_oldest_out():
    store = PrefixStore(max_bytes=64 * 10)  # room for 10 positions
    store.put("a", range(4), _layers(4), version=0)
    store.put("b", range(4), _layers(4), version=0)
    store.put("c", range(4), _layers(4), version=0)  # over: "a", the oldest, goes
    assert store.bytes == 64 * 8 and store.stats.evicted == 1
    assert store.take("a", list(range(9)), version=0) is None
    n, layers = store.take("b", [0, 1, 2, 7, 8], version=0)  # shares 3 tokens
    assert n == 3 and layers[0][0].shape == (1, 3, 4)
    assert store.take("b", list(range(9)), version=0) is None  # taken: gone
    store.put("big", range(11), _layers(11), version=0)  # larger than the cap: not kept
    assert len(store) == 1 and store.bytes == 64 * 4
    n, _ = store.take("c", [0, 1, 2, 3], version=0)
    assert n == 3  # at most all but the prompt's last token: it must be fed for logits
    store.put("d", range(4), _layers(4), version=0)
    assert store.take("d", list(range(9)), version=1) is None and store.stats.cleared == 1
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2 and common_prefix([], [1]) == 0


def test_the_run_config_sets_the_cap(tmp_path):
    from tracerl.config.loading import load_config
    from tracerl.preflight import prepare
    from tracerl.train.run import Run

    cfg = load_config(
        "configs/learn-arithmetic.yaml", [f"out_dir={tmp_path}", "model.prefix_cache_gb=0.25"]
    )
    assert Run(prepare(cfg)).sampler.prefixes.max_bytes == 2**28
    default = load_config("configs/learn-arithmetic.yaml", [f"out_dir={tmp_path}"])
    assert default.model.prefix_cache_gb == "auto"
    assert Run(prepare(default)).sampler.prefixes.max_bytes == 2**30  # auto, on the CPU
    with pytest.raises(Exception, match="prefix_cache_gb"):
        load_config(
            "configs/learn-arithmetic.yaml", [f"out_dir={tmp_path}", "model.prefix_cache_gb=-1"]
        )


def test_auto_is_a_tenth_of_a_gpus_memory_and_a_gib_on_a_cpu(bundle, monkeypatch):  # noqa: F811
    """``prefix_cache_gb: auto`` (the default) sizes the store by the device: 1 GiB on the CPU,
    a tenth of the card on a GPU (a 1.7B model's keys and values are 192 KiB a token: 1 GiB
    would keep ~5k tokens, a few episodes of a 64-episode rollout)."""
    assert BatchedHFSampler(bundle.model).prefixes.max_bytes == 2**30
    asked = []

    def properties(device):
        asked.append(device)
        return type("Props", (), {"total_memory": 141 * 10**9})()

    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    h200 = torch.device("cuda", 0)
    assert store_bytes("auto", h200) == 141 * 10**8 and asked == [h200]
    assert store_bytes(0.5, h200) == 2**29 and store_bytes(0, h200) == 0  # a number is GiB
    assert store_bytes("auto", torch.device("cpu")) == 2**30
    with pytest.raises(ValueError, match="'auto' or GiB"):
        store_bytes("lots", h200)
