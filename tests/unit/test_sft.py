"""SFT reports the NLL of its data before the first update and after the last one, so a
single epoch shows what it changed (its training loss alone would be one number twice)."""

from __future__ import annotations

import asyncio
import copy
import dataclasses

import pytest

from tracerl.envs import get_parser, make
from tracerl.rollout import ScriptedSampler
from tracerl.rollout.budget import Budgets, RolloutConfig
from tracerl.rollout.groups import episode_task_id, run_groups
from tracerl.rollout.runner import Policy
from tracerl.train.batch import bucketed_batches
from tracerl.train.sft import TokenizerMismatch, check_fit, mean_nll, sft

CFG = RolloutConfig(budgets=Budgets(steps=1), max_turn_tokens=4, reserve=None)


def _reference_trajectories(tiny):
    """Correct answers to eight sums, written by a script through the rollout engine."""
    tasks = make("arithmetic").sample_tasks(8, seed=0)
    by_id = {t["id"]: t for t in tasks}
    policy = Policy(
        ScriptedSampler.from_texts(
            tiny.renderer, lambda r: by_id[episode_task_id(r.episode_id)]["answers"][0]
        ),
        tiny.renderer,
        get_parser("json_list"),
        tiny.spec,
    )
    groups = asyncio.run(run_groups("arithmetic", tasks, policy, CFG, group_size=1))
    return [t for g in groups for e in g for t in e.trajectories]


def test_one_epoch_reports_the_nll_before_and_after_training(tiny):
    model = copy.deepcopy(tiny.model)  # updates must not leak into other tests
    trajs = _reference_trajectories(tiny)
    batches = bucketed_batches(trajs, [0.0] * len(trajs), 64)
    untrained = mean_nll(model, batches)

    result = sft(model, trajs, lr=1e-2, epochs=1, micro_batch_tokens=64)

    assert len(result.nll_epochs) == 1
    assert result.nll_before == pytest.approx(untrained, rel=1e-4)  # before the first update
    assert result.nll_after == pytest.approx(mean_nll(model, batches), rel=1e-4)  # after the last
    assert result.nll_after < result.nll_before - 0.5, result


def _with_receipt(trajs, **changes):
    return [
        dataclasses.replace(t, receipt=None if changes.get("none") else {**t.receipt, **changes})
        for t in trajs
    ]


def test_sft_refuses_token_ids_beyond_the_models_embedding(tiny):
    """SmolLM2's ids given to the character model: a two-line error, not an IndexError from
    inside the embedding."""
    from tracerl.models import load

    chars = load("tiny-chars").model
    trajs = _reference_trajectories(tiny)
    with pytest.raises(TokenizerMismatch, match=r"beyond the model's vocabulary \(95 ids\)") as e:
        sft(chars, trajs, lr=1e-3)
    assert e.value.message.startswith(f"sft: episode {trajs[0].episode_id} (sampled by ")
    assert "tokenized for another model" in e.value.hint


def test_check_fit_passes_the_models_own_trajectories_and_its_tokenizers_twins(tiny):
    trajs = _reference_trajectories(tiny)  # sampled by tiny-random: SmolLM2's tokenizer
    assert check_fit(trajs, "tiny-random", "data.jsonl") == []
    assert check_fit(trajs, "tiny-random-hd64", "data.jsonl") == []  # the same tokenizer


def test_check_fit_refuses_another_tokenizer_named_by_the_receipts(tiny):
    trajs = _reference_trajectories(tiny)
    with pytest.raises(TokenizerMismatch) as e:
        check_fit(trajs, "tiny-chars", "data.jsonl")
    assert e.value.message == (
        "data.jsonl: its trajectories were sampled by 'tiny-random', whose tokenizer differs "
        "from that of --model 'tiny-chars' (49152 tokens against 95)"
    )
    assert "--model tiny-random" in e.value.hint


def test_check_fit_warns_what_it_could_not_check(tiny):
    trajs = _reference_trajectories(tiny)
    (warning,) = check_fit(_with_receipt(trajs, none=True), "tiny-random", "data.jsonl")
    assert "8 of 8 trajectories carry no receipt naming the model that sampled them" in warning
    # a folder that is gone: its chat template (the receipts') is the one compared
    (warning,) = check_fit(_with_receipt(trajs, model_id="hf:/gone"), "tiny-random", "d")
    assert "'hf:/gone', which cannot be loaded here" in warning
    assert "so their tokenizer is taken to be the same" in warning
    # the same vocabulary, another chat template: the model learns that format
    other = _with_receipt(trajs, model_id="tiny-random", template_hash="0" * 64)
    (warning,) = check_fit(other, "tiny-random-hd64", "d")
    assert "rendered with 'tiny-random''s chat template" in warning


def test_check_fit_refuses_a_model_it_cannot_load_rendered_with_another_template(tiny):
    trajs = _with_receipt(_reference_trajectories(tiny), model_id="hf:/gone")
    with pytest.raises(TokenizerMismatch, match="with another chat template than --model"):
        check_fit(trajs, "tiny-chars", "d")
