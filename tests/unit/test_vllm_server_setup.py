"""What a vLLM server is started with, without starting one: the environment that lets its
compile cache be reused, and a model folder whose path stays the same from run to run (the
path is part of vLLM's compile-cache key)."""

from __future__ import annotations

import torch

from tracerl.engines import base_folder
from tracerl.engines.vllm import ServerSettings, VLLMServer
from tracerl.models import load


def test_the_server_uses_the_compile_cache_that_loads_back_and_a_user_setting_wins(
    tmp_path, monkeypatch
):
    server = VLLMServer(tmp_path, "m", ServerSettings(python="python"), tmp_path / "log")
    monkeypatch.delenv("VLLM_USE_AOT_COMPILE", raising=False)
    env = server.environment()
    assert env["VLLM_USE_AOT_COMPILE"] == "0"
    assert env["VLLM_CACHE_ROOT"].endswith("vllm")
    monkeypatch.setenv("VLLM_USE_AOT_COMPILE", "1")
    assert server.environment()["VLLM_USE_AOT_COMPILE"] == "1"


def test_a_model_without_a_folder_is_served_from_one_folder_per_weights(tmp_path):
    bundle = load("tiny-random-hd64")
    first = base_folder(bundle, tmp_path / "run1" / "engine")
    again = base_folder(load("tiny-random-hd64"), tmp_path / "run2" / "engine")
    assert first == again and (first / "model.safetensors").is_file()
    assert not (tmp_path / "run1").exists()  # nothing per run
    with torch.no_grad():
        bundle.model.get_input_embeddings().weight.add_(1.0)
    assert base_folder(bundle, tmp_path / "run3") != first  # other weights, another folder
