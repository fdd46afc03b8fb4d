"""Weight sync to a server the learner does not own: LoRA adapters hot-loaded into `tracerl
serve --enable-lora` (vLLM's routes), answers that carry the adapter's version, and the
errors a misconfigured deployment gets."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch

from tests.serve import tracerl_serve
from tracerl.rollout import BatchedHFSampler
from tracerl.rollout.remote import RemoteSampler
from tracerl.rollout.sampler import SampleRequest
from tracerl.rollout.serve import ServerThread
from tracerl.rollout.weight_sync import LoraAdapterSync, weight_sync_from_config
from tracerl.train.lora import apply_lora

REQUEST = SampleRequest((1, 2, 3, 4), 6, seed=11)
pytestmark = pytest.mark.timeout(300)  # servers in threads and processes: never hang CI


def _trained_lora(tiny):
    """A LoRA model whose adapters moved away from zero (as after an update)."""
    model = apply_lora(copy.deepcopy(tiny.model), r=2, alpha=4)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(len(name)))
    return model


async def _sample(url: str, model: str):
    remote = RemoteSampler(url, model)
    try:
        return await remote.sample(REQUEST)
    finally:
        await remote.close()


def test_tracerl_serve_hot_loads_adapters_and_answers_with_their_version(tiny, tmp_path):
    with tracerl_serve("tiny-random", "--enable-lora") as url:
        before = asyncio.run(_sample(url, "tiny-random"))
        learner = _trained_lora(tiny)
        sync = LoraAdapterSync(url, "tiny-random", tmp_path / "adapters", keep=1)
        names = [sync.push(learner, v) for v in (4, 5)]
        assert names == [f"tiny-random-{sync.tag}@v4", f"tiny-random-{sync.tag}@v5"]
        assert [p.name for p in (tmp_path / "adapters").iterdir()] == ["v5"]  # v4 unloaded
        after = asyncio.run(_sample(url, names[-1]))
    want = BatchedHFSampler(learner, temperature=1.0).generate_batch([REQUEST])[0]
    assert before.policy_version == 0 and after.policy_version == 5
    assert after.token_ids == want.token_ids  # the learner's weights, not the base model's
    assert after.logprobs == pytest.approx(want.logprobs, abs=1e-5)
    assert after.logprobs != pytest.approx(before.logprobs, abs=1e-3)


def test_a_server_without_lora_loading_says_how_to_start_it(tiny, tmp_path):
    server = ServerThread(BatchedHFSampler(copy.deepcopy(tiny.model)), "tiny-random")
    url = server.start()
    try:
        with pytest.raises(RuntimeError, match="enable-lora"):
            LoraAdapterSync(url, "tiny-random", tmp_path).push(_trained_lora(tiny), 1)
        with pytest.raises(ValueError, match=r"set model\.lora"):
            LoraAdapterSync(url, "tiny-random", tmp_path).push(tiny.model, 1)
    finally:
        server.stop()


def test_a_resumed_run_loads_its_adapters_beside_those_of_the_run_that_crashed(tiny, tmp_path):
    """As vLLM, the server refuses a name it holds and answers 404 for a model it does not
    have; a weight sync names its adapters for its own process, so a resume (or a second
    run) on the same server loads v<n> again under a new name."""
    sampler = BatchedHFSampler(copy.deepcopy(tiny.model))
    server = ServerThread(sampler, "tiny-random", enable_lora=True)
    url = server.start()
    learner = _trained_lora(tiny)
    try:
        crashed = LoraAdapterSync(url, "tiny-random", tmp_path / "a")
        name = crashed.push(learner, 1)
        with pytest.raises(RuntimeError, match="already been loaded"):
            crashed._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": "x"})
        resumed = LoraAdapterSync(url, "tiny-random", tmp_path / "b")
        again = resumed.push(learner, 1)
        assert again != name and again.endswith("@v1")
        got = asyncio.run(_sample(url, again))
        assert got.policy_version == 1
        with pytest.raises(ValueError, match=r"HTTP 404.*does not exist"):
            asyncio.run(_sample(url, "tiny-random-deadbeef@v9"))
    finally:
        server.stop()


def test_the_served_adapter_cannot_be_unloaded(tiny, tmp_path):
    sampler = BatchedHFSampler(copy.deepcopy(tiny.model))
    server = ServerThread(sampler, "tiny-random", enable_lora=True)
    url = server.start()
    try:
        sync = LoraAdapterSync(url, "tiny-random", tmp_path)
        name = sync.push(_trained_lora(tiny), 1)
        with pytest.raises(RuntimeError, match="being served"):
            sync._post("/v1/unload_lora_adapter", {"lora_name": name})
        with pytest.raises(RuntimeError, match=r"no adapter_model\.safetensors"):
            sync._post("/v1/load_lora_adapter", {"lora_name": "x@v2", "lora_path": str(tmp_path)})
    finally:
        server.stop()
    assert sampler.policy_version == 1  # the refused load changed nothing


class RecordingSync:
    def __init__(self, **kwargs):
        self.kwargs = kwargs

    def push(self, model, version):
        return None


def test_a_full_weight_hook_is_loaded_from_config(tmp_path):
    sync = weight_sync_from_config(
        f"{__name__}:RecordingSync", base_url="http://gpu:8000", served_model="m", folder=tmp_path
    )
    assert isinstance(sync, RecordingSync)
    assert sync.kwargs == {"base_url": "http://gpu:8000", "served_model": "m", "folder": tmp_path}
    for bad in ("nocolon", f"{__name__}:Missing"):
        with pytest.raises(ValueError, match="weight_sync"):
            weight_sync_from_config(bad, base_url="u", served_model="m", folder=tmp_path)


def test_an_answer_without_its_stop_token_is_refused():
    remote = RemoteSampler("http://unused", "m")
    answer = {
        "choices": [
            {
                "finish_reason": "stop",
                "logprobs": {"tokens": ["token_id:5", "token_id:6"], "token_logprobs": [-1, -2]},
            }
        ]
    }
    request = SampleRequest((1,), 4, frozenset({2}))
    with pytest.raises(ValueError, match="include_stop_str_in_output"):
        remote.result(answer, request)
    answer["choices"][0]["logprobs"]["tokens"][-1] = "token_id:2"
    assert remote.result(answer, request).token_ids == [5, 2]
