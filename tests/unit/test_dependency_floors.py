"""pyproject.toml's dependency floors are versions the suite passes with: every requirement
has a lower bound, `make install` (what CI runs) installs each at its floor's release series
(.ci/floors.py), and no floor admits a release known to break tracerl. And SmolLM2's
tokenizer ends turns with ``<|im_end|>`` whichever transformers read its GGUF."""

from __future__ import annotations

import importlib.util
import re
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = ROOT / "pyproject.toml"
MAKEFILE = ROOT / "Makefile"
PROJECT = tomllib.loads(PYPROJECT.read_text())["project"]
CORE = [Requirement(r) for r in PROJECT["dependencies"]]
EXTRAS = {
    (extra, r.name): r
    for extra, reqs in PROJECT["optional-dependencies"].items()
    for r in map(Requirement, reqs)
    if r.name != PROJECT["name"]  # `all`: the other extras, by name
}

KNOWN_BAD: dict[str, tuple[str, str]] = {
    "torch": ("2.6", "torch.distributed.fsdp.fully_shard (fsdp2) is public from 2.6 on"),
    "transformers": (
        "5.25",
        "5.17 reads SmolLM2's GGUF tokenizer with eos <|im_start|> and no pad token",
    ),
}
"""name -> (the first good version, what breaks before it): a floor below it is untrue."""


def floor(requirement: Requirement) -> Version | None:
    """The lowest version `requirement` admits (``>=``, ``==``, ``~=``), None without one."""
    lows = [Version(s.version) for s in requirement.specifier if s.operator in (">=", "==", "~=")]
    return max(lows, default=None)


def floor_problems(requirements: list[Requirement]) -> list[str]:
    """What is untrue about these requirements' floors, one line each."""
    problems = []
    for r in requirements:
        low = floor(r)
        if low is None:
            problems.append(f"{r}: no lower bound")
        elif r.name in KNOWN_BAD and low < Version(KNOWN_BAD[r.name][0]):
            good, why = KNOWN_BAD[r.name]
            problems.append(f"{r}: admits releases before {good}, where {why}")
    return problems


def installed(name: str) -> Version | None:
    try:
        return Version(version(name))
    except PackageNotFoundError:
        return None


def test_every_requirement_has_a_true_floor():
    assert floor_problems([*CORE, *EXTRAS.values()]) == []


def test_the_floor_check_catches_what_broke():
    """The old floors, which GPU images with other versions showed untrue, fail the check."""
    old = [Requirement(r) for r in ("transformers>=4.56", "torch>=2.4", "rich", "typer<1")]
    assert [p.split(":")[0] for p in floor_problems(old)] == [
        "transformers>=4.56",
        "torch>=2.4",
        "rich",
        "typer<1",
    ]


@pytest.mark.parametrize("requirement", CORE, ids=str)
def test_installed_core_dependency_satisfies_its_floor(requirement):
    have = installed(requirement.name)
    assert have is not None, f"{requirement.name} is a dependency but is not installed"
    assert requirement.specifier.contains(have, prereleases=True), f"{have} fails {requirement}"
    low = floor(requirement)
    assert low is not None and have.release[:2] >= low.release[:2], f"{have} below {low}"


@pytest.mark.parametrize("key", sorted(EXTRAS), ids=lambda k: f"{k[0]}:{k[1]}")
def test_installed_extra_satisfies_its_specifier(key):
    requirement = EXTRAS[key]
    have = installed(requirement.name)
    if have is None:
        pytest.skip(f"extra {key[0]}: {requirement.name} is not installed here")
    assert requirement.specifier.contains(have, prereleases=True), f"{have} fails {requirement}"


# The floor set: `make install` (what CI runs) holds every requirement to its floor's series


def _floor_set() -> dict[str, str]:
    spec = importlib.util.spec_from_file_location("floors", ROOT / ".ci" / "floors.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.floors(PYPROJECT)


def in_series(have: Version, floor_version: str) -> bool:
    """`have` is a release of the series `floor_version` names (5.25.3 of 5.25, 0.0.7 of 0.0.7)."""
    want = Version(floor_version).release
    return have.release[: len(want)] == want


def test_the_floor_set_holds_every_requirement_to_its_floor():
    pins = _floor_set()
    every = {r.name.lower() for r in [*CORE, *EXTRAS.values()]}
    assert set(pins) == every
    assert all(str(floor(r)) == pins[r.name.lower()] for r in [*CORE, *EXTRAS.values()])
    torch_pin = re.search(r"^TORCH_PIN\s*:=\s*torch==(\S+)", MAKEFILE.read_text(), re.M)
    assert torch_pin is not None and in_series(Version(torch_pin[1]), pins["torch"]), (
        "the Makefile's torch pin is outside torch's floor series"
    )


def test_the_gpu_machines_wheels_are_of_the_floor_set_too():
    """`make gpu-wheels` brings the GPU machine the same releases CI tests (torch aside: the
    GPU image's own CUDA build is used there, docs/gpu.md)."""
    pins = _floor_set()
    script = (ROOT / "benchmarks" / "gpu_wheels.sh").read_text()
    wheels = dict(re.findall(r"(?<![\w.-])([A-Za-z][\w.-]*)==([0-9][\w.]*)", script))
    ours = {name.lower(): v for name, v in wheels.items() if name.lower() in pins}
    assert {"transformers", "pydantic", "typer", "accelerate", "openai", "trl"} <= set(ours)
    off = [
        f"{n}=={v} (floor {pins[n]})" for n, v in ours.items() if not in_series(Version(v), pins[n])
    ]
    assert off == [], "benchmarks/gpu_wheels.sh pins releases outside the floor set"


def test_the_venv_ci_runs_is_the_floor_set():
    """Each requirement installed here is of its floor's release series, so a passing suite
    has passed with the floors. Only in a venv `make install` built (it leaves floors.txt in
    the venv); another environment may hold newer releases."""
    if not (Path(sys.prefix) / "floors.txt").is_file():
        pytest.skip("not the venv `make install` builds (no floors.txt in it)")
    pins = _floor_set()
    off = [
        f"{name} {have} (floor {pins[name]})"
        for name in sorted(pins)
        if (have := installed(name)) is not None and not in_series(have, pins[name])
    ]
    assert off == [], "installed outside the floor set; rerun `make install`"
    assert installed("torch") is not None and installed("transformers") is not None


# SmolLM2's tokenizer: the runtime side of the transformers floor


def test_smollm2_tokenizer_ends_turns_with_im_end_and_pads_with_it():
    from tracerl.models.loading import smollm2_tokenizer

    tok = smollm2_tokenizer()
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert (tok.eos_token, tok.eos_token_id) == ("<|im_end|>", im_end)
    assert (tok.pad_token, tok.pad_token_id) == ("<|im_end|>", im_end)
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
        tokenize=False,
    )
    assert "hello<|im_end|>" in text  # the token the template ends the assistant's turn with


def test_a_tokenizer_an_older_transformers_cached_is_repaired(tmp_path, monkeypatch):
    """transformers 5.17 read eos <|im_start|> and no pad token, and saved that to the cache;
    loading that cache gives the turn end back."""
    from transformers import AutoTokenizer

    from tracerl.models.loading import file_sha256, smollm2_gguf_path, smollm2_tokenizer

    tok = smollm2_tokenizer()
    sha = file_sha256(smollm2_gguf_path())
    tok.eos_token = "<|im_start|>"
    tok.pad_token = None
    stale = tmp_path / "tokenizers" / f"smollm2-{sha[:16]}"
    tok.save_pretrained(stale)
    as_saved = AutoTokenizer.from_pretrained(stale, local_files_only=True)
    assert (as_saved.eos_token, as_saved.pad_token) == ("<|im_start|>", None)  # as 5.17's
    monkeypatch.setenv("TRACERL_CACHE", str(tmp_path))

    repaired = smollm2_tokenizer()
    assert (repaired.eos_token, repaired.pad_token) == ("<|im_end|>", "<|im_end|>")
    assert repaired.eos_token_id == repaired.pad_token_id == 2
