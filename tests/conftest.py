"""Shared fixtures: real tokenizers and real chat templates, loaded from installed packages.

The suite runs on a cache of its own: `pytest_configure` points ``$TRACERL_CACHE`` at a new
empty folder before any test runs, so every cached artefact (BM25 and dense indexes, the
converted SmolLM2 weights, tokenizers) is built by this run, as on a new machine, and no
test can pass only because an earlier run left something in ``~/.cache/tracerl``. Building
them all costs about 30 s. The folder is deleted at the end of the run.

Every process of the run computes on one thread (``$OMP_NUM_THREADS``, unless it is set
already; subprocesses, torchrun ranks, Ray workers and servers inherit it). The suite's
models are small, and where the cores are busy (a test's own subprocess or server, other
work on the machine) each of their many small ops waits for the thread that has no core:
measured under load, one SFT took 202 s on two threads and 13 s on one, and
tests/integration/test_smollm2.py 292 s and 144 s.

`make test` runs the suite on two pytest-xdist workers (``-n 2 --dist loadscope``): a test
module is one unit of work, so its module-scoped fixtures (a vLLM server, a Ray cluster) are
built once, on one worker. Each worker has its own cache folder, and each Ray cluster is
its process's own (``address="local"``), so the two workers share nothing.
"""

from __future__ import annotations

import copy
import importlib.resources
import os
import shutil
import sys
import tempfile
from collections.abc import Callable

import pytest

from tracerl.models.loading import smollm2_tokenizer
from tracerl.models.render import ChatRenderer

# Each family's control tokens, added to SmolLM2's real BPE so they are single tokens as in the
# family's own tokenizer (Qwen and Llama tokenizers are not shipped by any package we may
# install; their templates are, inside `trl`). As in the real tokenizers, Qwen's tool and
# think markers are added tokens that are *not* special; Llama 3's are special.
QWEN_MARKERS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
FAMILY_TOKENS = {
    "smollm2": {},
    "qwen2_5": {"added": QWEN_MARKERS, "eos": "<|im_end|>"},
    "qwen3": {"added": [*QWEN_MARKERS, "<think>", "</think>"], "eos": "<|im_end|>"},
    "llama3_2": {
        "special": [
            "<|begin_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
            "<|eom_id|>",
            "<|python_tag|>",
        ],
        "eos": "<|eot_id|>",
        "bos": "<|begin_of_text|>",
    },
}


def pytest_configure(config):
    fresh = tempfile.mkdtemp(prefix="tracerl-test-cache-")
    config._tracerl_cache = (fresh, os.environ.get("TRACERL_CACHE"))
    os.environ["TRACERL_CACHE"] = fresh  # subprocesses (Ray workers, servers) inherit it
    config._omp_threads = os.environ.get("OMP_NUM_THREADS")
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch starts its thread pool
    if "torch" in sys.modules:  # imported already (by a plugin): its pool too
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


# The longest module (~15 min of a worker): handed out first, so the other worker takes the
# rest beside it instead of waiting for it at the end.
FIRST = ("tests/integration/test_vllm_engine.py",)


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in FIRST)  # stable
    # the GPU tier (tests/gpu/, `make gpu-check`): skipped, never failed, without CUDA
    # (TRACERL_GPU_TIER_ON_CPU=1: the tier's dry run on the CPU, tests/gpu/conftest.py)
    if not _cuda() and os.environ.get("TRACERL_GPU_TIER_ON_CPU") != "1":
        skip = pytest.mark.skip(reason="needs a CUDA GPU (the gpu tier: make gpu-check)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.fixture(scope="session")
def device() -> str:
    """Where the device-sensitive tests place their models: ``$TRACERL_TEST_DEVICE`` (cpu by
    default; ``make gpu-check`` runs them again with cuda)."""
    want = os.environ.get("TRACERL_TEST_DEVICE", "cpu")
    if want == "cuda" and not _cuda():
        pytest.skip("TRACERL_TEST_DEVICE=cuda but no CUDA GPU is visible")
    return want


def skip_unless_compilable(device: str) -> None:
    """Skip a test of compiled decode steps where the sampler turns `model.compile` off (a
    torch older than 2.13 on a CPU: `StaticSlots.compile_unsafe`)."""
    import torch

    from tracerl.rollout.decode_batch import StaticSlots

    why = StaticSlots.compile_unsafe(torch.device(device))
    if why is not None:
        pytest.skip(f"model.compile is off here: {why}")


def pytest_unconfigure(config):
    if getattr(config, "_omp_threads", "") is None:
        os.environ.pop("OMP_NUM_THREADS", None)
    fresh, before = getattr(config, "_tracerl_cache", (None, None))
    if fresh is None:
        return
    shutil.rmtree(fresh, ignore_errors=True)
    if before is None:
        os.environ.pop("TRACERL_CACHE", None)
    else:
        os.environ["TRACERL_CACHE"] = before


def family_tokenizer(base, family: str):
    """A copy of `base` with the family's control tokens and eos/bos."""
    tok = copy.deepcopy(base)
    spec = FAMILY_TOKENS[family]
    if spec.get("special"):
        tok.add_special_tokens({"additional_special_tokens": spec["special"]})
    if spec.get("added"):
        tok.add_tokens(spec["added"], special_tokens=False)
    if spec.get("eos"):
        tok.eos_token = spec["eos"]
    if spec.get("bos"):
        tok.bos_token = spec["bos"]
    return tok


def trl_template(name: str) -> str:
    """A chat template as shipped in the installed `trl` package (never copied here)."""
    return (importlib.resources.files("trl") / "chat_templates" / f"{name}.jinja").read_text()


@pytest.fixture(scope="session")
def vllm_python() -> str:
    """The Python that runs vLLM (`.venv-vllm`, made by `make vllm`). Without one the test
    is skipped, or fails where ``TRACERL_REQUIRE_VLLM`` says vLLM must be there
    (`make test`)."""
    from tracerl.engines.vllm_python import EngineError, find_vllm_python

    try:
        return find_vllm_python()
    except EngineError as e:
        if os.environ.get("TRACERL_REQUIRE_VLLM"):
            pytest.fail(f"vLLM is required here (make test installs it): {e}")
        pytest.skip(f"vLLM is not installed: {e}")


@pytest.fixture(scope="session")
def base_tokenizer():
    return smollm2_tokenizer()


@pytest.fixture
def family_renderer(base_tokenizer) -> Callable[..., ChatRenderer]:
    """family_renderer("qwen3", **kwargs) -> a renderer with that family's template."""

    base = base_tokenizer

    def make(family: str, **kwargs) -> ChatRenderer:
        template = None if family == "smollm2" else trl_template(family)
        return ChatRenderer(family_tokenizer(base, family), template, **kwargs)

    return make


@pytest.fixture(scope="session")
def tiny():
    """The tiny random policy bundle (SmolLM2's tokenizer and template, random weights)."""
    from tracerl.models import load

    return load("tiny-random")


@pytest.fixture(scope="session")
def scripted_run(tiny, tmp_path_factory):
    """A small real run directory with known failures (see tests/report_run.py)."""
    from tests.report_run import build_run

    return build_run(tmp_path_factory.mktemp("scripted-run"), tiny, copy.deepcopy(tiny.model))
