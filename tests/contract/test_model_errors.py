"""A model the user points at that cannot serve, through the real `tracerl` command: a
broken Hugging Face folder, or trajectories tokenized for another model than the one SFT
would tune. Each is two lines ("error: what, where", then what to do), exit status 2, no
traceback, and nothing written."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from tests.command import run_tracerl
from tracerl.jsonl import dumps


def _tracerl(args: list[str], cwd: Path, cache: Path):
    return run_tracerl(args, cwd, cache)


def _two_lines(r, first: str, second: str) -> list[str]:
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr + r.stdout, r.stderr
    assert len(lines) == 2, r.stderr
    assert lines[0].startswith("error: ") and first in lines[0], lines
    assert second in lines[1], lines
    return lines


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A folder `save_pretrained` wrote: the tiny character model (fast to load)."""
    from tracerl.models import load

    good = tmp_path_factory.mktemp("models") / "good"
    bundle = load("tiny-chars")
    bundle.model.save_pretrained(good)
    bundle.tokenizer.save_pretrained(good)
    return good


def _without_weights(f: Path) -> None:
    (f / "model.safetensors").unlink()


def _without_tokenizer(f: Path) -> None:
    for p in f.glob("tokenizer*"):
        p.unlink()


def _empty_config(f: Path) -> None:
    (f / "config.json").write_text("{}")


def _without_chat_template(f: Path) -> None:
    (f / "chat_template.jinja").unlink()


def _a_shard_missing(f: Path) -> None:
    (f / "model.safetensors").rename(f / "model-00001-of-00002.safetensors")
    shards = {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}
    (f / "model.safetensors.index.json").write_text(json.dumps({"weight_map": shards}))


def _weights_cut_short(f: Path) -> None:  # found only when transformers reads them
    data = (f / "model.safetensors").read_bytes()
    (f / "model.safetensors").write_bytes(data[: len(data) // 2])


def _weights_of_another_shape(f: Path) -> None:
    config = json.loads((f / "config.json").read_text())
    (f / "config.json").write_text(json.dumps({**config, "hidden_size": 128}))


# how the folder is broken -> what the first line says
BROKEN = {
    "no weights": (_without_weights, "no weights (*.safetensors, pytorch_model*.bin"),
    "no tokenizer": (_without_tokenizer, "no tokenizer (tokenizer.json"),
    "config.json of {}": (_empty_config, "config.json names no model_type"),
    "no chat template": (_without_chat_template, "no chat template"),
    "a shard missing": (_a_shard_missing, "the shard model-00002-of-00002.safetensors"),
    "weights cut short": (_weights_cut_short, "transformers cannot load the model in it"),
    "weights of another shape": (
        _weights_of_another_shape,
        "transformers cannot load the model in it: the weights' shapes differ",
    ),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_model_folder_is_two_lines_naming_the_folder_and_what_it_lacks(
    case, folder, tmp_path
):
    broken = tmp_path / "model"
    shutil.copytree(folder, broken)
    breaks, says = BROKEN[case]
    breaks(broken)
    r = _tracerl(["load-model", f"hf:{broken}"], tmp_path, tmp_path / "cache")
    lines = _two_lines(r, says, "pass a folder that save_pretrained wrote")
    assert lines[0].startswith(f"error: hf:{broken}: "), lines


def test_a_run_on_a_broken_model_folder_stops_before_writing_the_run(folder, tmp_path):
    broken = tmp_path / "model"
    shutil.copytree(folder, broken)
    _without_weights(broken)
    args = [
        "train",
        f"model.spec=hf:{broken}",
        "env.name=arithmetic",
        "name=broken",
        f"out_dir={tmp_path / 'runs'}",
    ]
    r = _tracerl(args, tmp_path, tmp_path / "cache")
    _two_lines(r, f"model.spec: hf:{broken}: not a model folder tracerl can load: no weights", "")
    assert not (tmp_path / "runs").exists()  # no config.yaml, nothing


def _write_trajectories(path: Path, tokenizer, spec: str, receipts: bool = True) -> None:
    """Two arithmetic episodes, each answered right by a script, rendered with `tokenizer`
    and recorded as sampled by `spec` (their receipts name it)."""
    from tracerl.envs import get_parser, make
    from tracerl.models.render import ChatRenderer
    from tracerl.rollout import ScriptedSampler
    from tracerl.rollout.budget import Budgets, RolloutConfig
    from tracerl.rollout.groups import episode_task_id, run_groups
    from tracerl.rollout.runner import Policy

    renderer = ChatRenderer(tokenizer)
    tasks = make("arithmetic").sample_tasks(2, seed=0)
    by_id = {t["id"]: t for t in tasks}
    policy = Policy(
        ScriptedSampler.from_texts(
            renderer, lambda r: by_id[episode_task_id(r.episode_id)]["answers"][0]
        ),
        renderer,
        get_parser("json_list"),
        spec,
    )
    cfg = RolloutConfig(budgets=Budgets(steps=1), max_turn_tokens=4, reserve=None)
    groups = asyncio.run(run_groups("arithmetic", tasks, policy, cfg, group_size=1))
    with open(path, "w") as f:
        for t in (t for g in groups for e in g for t in e.trajectories):
            row = json.loads(dumps(t))
            if not receipts:
                row["receipt"] = None
            f.write(json.dumps(row) + "\n")


@pytest.fixture(scope="module")
def trajectories(tmp_path_factory, base_tokenizer):
    """Trajectories tiny-random sampled (SmolLM2's tokenizer), with and without receipts, and
    trajectories tiny-chars sampled."""
    from tracerl.models.loading import char_tokenizer

    root = tmp_path_factory.mktemp("trajectories")
    _write_trajectories(root / "random.jsonl", base_tokenizer, "tiny-random")
    _write_trajectories(root / "bare.jsonl", base_tokenizer, "tiny-random", receipts=False)
    _write_trajectories(root / "chars.jsonl", char_tokenizer(), "tiny-chars")
    return root


def _sft(data: Path, model: str, tmp_path: Path):
    args = ["sft", str(data), "--out", str(tmp_path / "tuned"), "--model", model, "--all"]
    return _tracerl(args, tmp_path, tmp_path / "cache")


def test_sft_refuses_trajectories_sampled_by_a_model_with_another_tokenizer(trajectories, tmp_path):
    """Their ids would index past tiny-chars's embedding (the old command's IndexError)."""
    data = trajectories / "random.jsonl"
    _two_lines(
        _sft(data, "tiny-chars", tmp_path),
        f"{data}: its trajectories were sampled by 'tiny-random', whose tokenizer differs from "
        "that of --model 'tiny-chars' (49152 tokens against 95)",
        "(--model tiny-random)",
    )
    assert not (tmp_path / "tuned").exists()


def test_sft_refuses_ids_that_fit_the_vocabulary_but_mean_other_tokens(trajectories, tmp_path):
    """tiny-chars's ids are all below SmolLM2's 49152: the old command trained on them
    silently, each id read as another token. The receipts name the model that sampled
    them."""
    data = trajectories / "chars.jsonl"
    _two_lines(
        _sft(data, "tiny-random", tmp_path),
        f"{data}: its trajectories were sampled by 'tiny-chars', whose tokenizer differs from "
        "that of --model 'tiny-random' (95 tokens against 49152)",
        "(--model tiny-chars)",
    )
    assert not (tmp_path / "tuned").exists()


def test_sft_refuses_token_ids_beyond_the_vocabulary_of_trajectories_without_receipts(
    trajectories, tmp_path
):
    """No receipt names their model: their ids, beyond tiny-chars's 95, give them away (the
    old command died in the embedding with IndexError)."""
    data = trajectories / "bare.jsonl"
    lines = _two_lines(
        _sft(data, "tiny-chars", tmp_path), f"{data}: episode ", "tokenized for another model"
    )
    assert "beyond the vocabulary of --model 'tiny-chars' (95 ids)" in lines[0], lines
    assert not (tmp_path / "tuned").exists()
