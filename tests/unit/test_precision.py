"""Device and precision: one place decides (`tracerl.models.placement`), and what it decides
holds where a user would notice — small updates survive under bf16-mixed, the sampler and
the learner agree on log-probs, a tensor on the wrong device is named, fp32 stays fp32 on CPU.

These run on the CPU (bf16 autocast works there too, slowly); ``make gpu-check`` runs them
again on CUDA (``TRACERL_TEST_DEVICE=cuda``: the `device` fixture) beside tests/gpu/.
"""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch

from tracerl.config import ConfigError, load_config
from tracerl.envs import get_parser, make
from tracerl.models.placement import (
    DeviceMismatch,
    Placement,
    check_device,
    computing,
    device_of,
    place,
    placement_of,
    resolve,
)
from tracerl.rollout import BatchedHFSampler
from tracerl.rollout.budget import Budgets, RolloutConfig
from tracerl.rollout.runner import Policy, run_episode
from tracerl.rollout.sampler import SampleRequest
from tracerl.train import padded_batch, token_logprobs
from tracerl.train.batch import Batch
from tracerl.train.learner import Learner, LearnerConfig

CFG = RolloutConfig(budgets=Budgets(steps=1), max_turn_tokens=8, reserve=None)
CPU = torch.device("cpu")


def test_the_settings_resolve_to_one_placement():
    assert resolve("cpu") == Placement(CPU, torch.float32, torch.float32, "fp32")
    mixed = resolve("cpu", "bfloat16")  # bf16 compute: fp32 master weights unless asked
    assert (mixed.weights, mixed.compute, mixed.precision) == (
        torch.float32,
        torch.bfloat16,
        "bf16-mixed",
    )
    assert resolve("cpu", "auto", "bf16-mixed") == mixed
    pure = resolve("cpu", "auto", "bf16")
    assert (pure.weights, pure.compute) == (torch.bfloat16, torch.bfloat16)
    assert mixed.frozen() == Placement(CPU, torch.bfloat16, torch.bfloat16, "bf16")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no GPU is visible; use auto"):
            resolve("cuda")
        assert resolve("auto").device == CPU


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["model.dtype=float32", "trainer.precision=bf16-mixed"], "trainer.precision=fp32"),
        (["model.dtype=bfloat16", "trainer.precision=fp32"], "model.dtype=auto"),
    ],
)
def test_a_dtype_and_a_precision_that_contradict_are_refused_naming_both(overrides, says):
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    assert "model.dtype" in str(e.value) and says in str(e.value)


def test_every_precision_is_a_config_value():
    for p in ("auto", "fp32", "bf16-mixed", "bf16"):
        assert load_config(None, [f"trainer.precision={p}"]).trainer.precision == p
    with pytest.raises(ConfigError, match=r"trainer\.precision"):
        load_config(None, ["trainer.precision=fp16"])


@pytest.fixture
def trajectories(tiny, device):
    model = place(copy.deepcopy(tiny.model), resolve(device))
    policy = Policy(
        BatchedHFSampler(model, temperature=1.0), tiny.renderer, get_parser("json_list"), "t"
    )
    task = make("refund_desk").sample_tasks(1)[0]
    episodes = [
        asyncio.run(run_episode(make("refund_desk"), task, policy, CFG, seed=s)) for s in range(2)
    ]
    return [e.trajectories[0] for e in episodes]


@pytest.fixture
def placed(tiny, device):
    """A fresh copy of the tiny model placed on the test device in `precision`."""

    def make(precision):
        return place(copy.deepcopy(tiny.model), resolve(device, "auto", precision))

    return make


def test_fp32_on_cpu_is_exactly_what_it_was(tiny, trajectories):
    """The default on a CPU moves no number: same weights dtype, no autocast, and one update
    equals the one an unplaced model takes."""
    assert resolve("cpu").precision == "fp32" and not resolve("cpu").mixed
    placed = place(copy.deepcopy(tiny.model), resolve("cpu"))
    plain = copy.deepcopy(tiny.model)
    for model in (placed, plain):
        Learner(model, LearnerConfig(lr=1e-3)).update(trajectories, [1.0, -1.0])
    for (name, a), b in zip(placed.named_parameters(), plain.parameters(), strict=True):
        assert a.dtype == torch.float32 and torch.equal(a, b), name


def test_bf16_mixed_keeps_fp32_master_weights_so_small_updates_survive(placed, trajectories):
    """At lr 1e-6 an AdamW step moves each weight by about 1e-6: below half of bf16's spacing
    for nearly every weight, so pure bf16 loses it; fp32 master weights keep it."""
    changed = {}
    for precision in ("bf16-mixed", "bf16"):
        model = placed(precision)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        learner = Learner(model, LearnerConfig(lr=1e-6))
        m = learner.update(trajectories, [1.0, -1.0])
        assert m["train/grad_norm"] > 0
        moved = sum(int((p != before[n]).sum()) for n, p in model.named_parameters())
        changed[precision] = moved / sum(p.numel() for p in model.parameters())
        state = next(iter(learner.optimizer.state.values()))
        want = torch.float32 if precision == "bf16-mixed" else torch.bfloat16
        assert state["exp_avg"].dtype == want and next(model.parameters()).dtype == want
    assert changed["bf16-mixed"] > 0.9, changed
    assert changed["bf16"] < 0.05, changed


def test_bf16_mixed_computes_in_bf16_for_the_learner_and_the_sampler(placed):
    """The forward (the learner's and the in-process sampler's, which share the weights)
    runs under autocast: a projection's output is bf16 while the weights stay fp32."""
    model = placed("bf16-mixed")
    seen: list[torch.dtype] = []
    layer = model.get_decoder().layers[0].mlp.down_proj
    handle = layer.register_forward_hook(lambda mod, args, out: seen.append(_first(out).dtype))
    ids = torch.tensor([[1, 2, 3, 4, 5]], device=device_of(model))
    token_logprobs(model, ids, torch.ones_like(ids))
    BatchedHFSampler(model, seed=0).generate_batch([SampleRequest([1, 2, 3], 2, [])])
    handle.remove()
    assert seen and set(seen) == {torch.bfloat16}, seen
    assert next(model.parameters()).dtype == torch.float32
    fp32 = placed("fp32")
    with computing(fp32):
        assert not torch.is_autocast_enabled(device_of(fp32).type)


def _first(out):
    return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize(("precision", "tolerance"), [("fp32", 1e-4), ("bf16-mixed", 0.1)])
def test_the_learners_log_probs_match_the_samplers(placed, precision, tolerance):
    """What docs/gpu.md states: the learner's recomputed log-probs of sampled tokens agree
    with the sampler's within 1e-4 in fp32 and 0.1 (max over tokens) in bf16-mixed (bf16
    keeps 8 bits of mantissa; the mean gap is far smaller and the IS correction absorbs it)."""
    model = placed(precision)
    prompt = list(range(5, 40))
    sampler = BatchedHFSampler(model, temperature=1.0, seed=0)
    res = sampler.generate_batch([SampleRequest(prompt, 24, [], seed=s) for s in range(4)])
    gaps = []
    for r in res:
        ids = torch.tensor([prompt + r.token_ids], device=device_of(model))
        with torch.no_grad():
            lp = token_logprobs(model, ids, torch.ones_like(ids))[0, len(prompt) :].cpu()
        gaps.append((lp - torch.tensor(r.logprobs)).abs())
    gap = torch.cat(gaps)
    assert float(gap.max()) <= tolerance, (float(gap.max()), float(gap.mean()))
    assert float(gap.mean()) <= tolerance / 5


def test_a_tensor_on_another_device_than_the_model_is_named():
    """A batch built for the wrong device fails before the forward, naming the tensor and
    the fix, instead of a device error deep inside torch."""
    model = torch.nn.Embedding(10, 4)
    model.get_input_embeddings = lambda: model
    elsewhere = torch.zeros(1, 3, dtype=torch.long, device="meta")
    with pytest.raises(DeviceMismatch, match=r"input_ids_B_T is on meta .* on cpu.*device_of"):
        check_device(model, "the step", input_ids_B_T=elsewhere)
    check_device(model, "the step", input_ids_B_T=torch.zeros(1, 3, dtype=torch.long))


def test_token_logprobs_refuses_inputs_the_model_cannot_read(placed):
    model = placed("fp32")
    ids = torch.tensor([[1, 2, 3]], device="meta")
    with pytest.raises(DeviceMismatch, match="token_logprobs: input_ids_B_T"):
        token_logprobs(model, ids, torch.ones(1, 3, dtype=torch.long))


def test_every_batch_the_learner_runs_is_moved_to_the_models_device(
    placed, trajectories, monkeypatch
):
    """A spy on `Batch.to`: the learner builds its micro-batches on the CPU and moves each
    one, once, to `device_of(model)` (on a GPU: the CUDA device) before its forward."""
    moved: list[torch.device] = []
    real = Batch.to

    def spy(self, device):
        moved.append(torch.device(device))
        return real(self, device)

    monkeypatch.setattr(Batch, "to", spy)
    model = placed("fp32")
    m = Learner(model, LearnerConfig(lr=1e-4, micro_batch_tokens=64)).update(
        trajectories, [1.0, -1.0]
    )
    assert len(moved) == int(m["train/micro_batches"]) >= 2
    assert set(moved) == {device_of(model)}


def test_a_placement_travels_with_copies_and_lora(placed):
    model = placed("bf16-mixed")
    assert placement_of(copy.deepcopy(model)).mixed  # the KL reference's frozen copy
    pytest.importorskip("peft")
    from tracerl.train.lora import apply_lora

    assert placement_of(apply_lora(model, r=2)).precision == "bf16-mixed"


def test_padded_batches_move_whole(tiny, trajectories):
    b = padded_batch(trajectories, [1.0, -1.0], weights=[1.0, 2.0]).to("meta")
    tensors = [
        b.input_ids_B_T,
        b.attention_mask_B_T,
        b.loss_mask_B_T,
        b.old_logprobs_B_T,
        b.advantages_B,
        b.weights_B,
    ]
    assert {t.device.type for t in tensors} == {"meta"}


def test_each_torchrun_rank_places_its_model_on_its_own_gpu(monkeypatch):
    """Under torchrun every rank resolves auto (and cuda) to ``cuda:LOCAL_RANK``, the GPU its
    NCCL group uses, whatever the current device was when the model was placed."""
    from tracerl.train.distributed.ranks import Ranks
    from tracerl.train.distributed.ranks import device_of as rank_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert resolve("auto").device == torch.device("cuda", 3) == resolve("cuda").device
    assert rank_device(Ranks(3, 4, 3), "auto") == torch.device("cuda", 3)
    assert rank_device(Ranks(3, 4, 3), "cpu") == CPU
    monkeypatch.delenv("LOCAL_RANK")
    assert resolve("auto").device == torch.device("cuda", 0)


def test_a_lora_runs_frozen_base_keeps_no_master_copy(tmp_path, trajectories):
    """LoRA under bf16-mixed: the base never trains, so its weights stay in the compute
    dtype (half the memory of fp32 master weights); the adapters, the only weights that
    train, and their optimizer state are fp32, so small updates still land."""
    pytest.importorskip("peft")
    from tracerl.config.loading import load_config
    from tracerl.preflight import prepare
    from tracerl.train.run import Run

    cfg = load_config(
        "configs/learn-arithmetic.yaml",
        [f"out_dir={tmp_path}", "model.spec=tiny-random", "model.lora.r=4", "model.dtype=bfloat16"],
    )
    run = Run(prepare(cfg))
    assert (
        run.placement.describe() == "cpu bf16-mixed (base bf16, LoRA adapters fp32, compute bf16)"
    )
    model = run.bundle.model
    kinds = {(p.requires_grad, p.dtype) for p in model.parameters()}
    assert kinds == {(False, torch.bfloat16), (True, torch.float32)}
    learner = Learner(model, LearnerConfig(lr=1e-6))
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    learner.update(trajectories, [1.0, -1.0])
    moved = [n for n, p in model.named_parameters() if p.requires_grad and not p.equal(before[n])]
    # every adapter's B (zero at first: A's gradient is zero until B moves) moved by ~1e-6
    assert moved == [n for n in before if "lora_B" in n] and moved
    assert {s["exp_avg"].dtype for s in learner.optimizer.state.values()} == {torch.float32}
