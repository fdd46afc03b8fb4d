"""How evaluations sample (the ``eval`` section): their temperature (0: greedy, through the
in-process sampler and through a completion server) without touching training's, k samples
per task reported as mean@k and pass@k with standard errors (hand-computed here), and the
config's refusals."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest

from tracerl.config import ConfigError, RunConfig
from tracerl.config.loading import load_config
from tracerl.rollout import BatchedHFSampler
from tracerl.rollout.remote import RemoteSampler
from tracerl.rollout.runner import Policy
from tracerl.rollout.sampler import SampleRequest
from tracerl.train.evaluation import eval_policy
from tracerl.train.metrics import sample_metrics, stderr


def _episodes(solved):
    return [SimpleNamespace(reward=SimpleNamespace(succeeded=bool(s))) for s in solved]


def test_mean_and_pass_at_k_and_their_standard_errors_by_hand():
    # four tasks, two samples each: solved 1/2, 2/2, 0/2, 1/2
    groups = [_episodes(s) for s in ([1, 0], [1, 1], [0, 0], [0, 1])]
    m = sample_metrics(groups)
    assert m["mean@2"] == 0.5
    # per-task means .5, 1, 0, .5: squared deviations sum to .5; / (n-1) / n
    assert m["mean@2_stderr"] == pytest.approx(math.sqrt(0.5 / 3 / 4))
    assert m["success_rate_stderr"] == m["mean@2_stderr"]
    assert m["pass@2"] == 0.75  # three of the four tasks solved at least once
    assert m["pass@2_stderr"] == pytest.approx(math.sqrt(0.75 / 3 / 4))
    assert m["pass@2"] >= m["mean@2"]


def test_one_sample_per_task_is_the_binomial_standard_error():
    groups = [_episodes([s]) for s in [1, 1, 1, 0, 0, 0, 0, 0]]  # 3 of 8
    m = sample_metrics(groups)
    assert m["mean@1"] == m["pass@1"] == 3 / 8
    assert m["success_rate_stderr"] == pytest.approx(math.sqrt(3 / 8 * 5 / 8 / 7))
    assert stderr([1.0]) == 0.0 and stderr([]) == 0.0  # one task: no spread to measure


def test_an_unscored_episode_counts_as_unsolved():
    groups = [[SimpleNamespace(reward=None), *_episodes([1])]]
    assert sample_metrics(groups)["mean@2"] == 0.5 and sample_metrics(groups)["pass@2"] == 1.0


def test_a_completion_server_samples_greedily_for_an_evaluation():
    train = RemoteSampler("http://127.0.0.1:1", "policy", temperature=0.8, policy_version=3)
    greedy = train.with_temperature(0.0)
    body = greedy.body(SampleRequest(prompt_ids=(1, 2), max_tokens=4, seed=7))
    assert body["temperature"] == 0.0 and body["seed"] == 7  # vLLM's greedy
    assert (greedy.base_url, greedy.model) == ("http://127.0.0.1:1", "policy")
    assert greedy.policy_version == 3
    assert train.temperature == 0.8  # training's sampler is untouched
    assert RemoteSampler("http://x", "m", temperature=0).temperature == 0
    with pytest.raises(ValueError, match=">= 0"):
        RemoteSampler("http://x", "m", temperature=-0.1)


def test_the_eval_policy_has_its_own_sampler_over_the_same_weights(tiny):
    sampler = BatchedHFSampler(tiny.model, temperature=1.0, seed=0, policy_version=5)
    policy = Policy.from_bundle(tiny, sampler)
    cfg = RunConfig()
    assert eval_policy(cfg, policy) is policy  # unset: the training temperature, as before
    same = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"temperature": 1.0})})
    assert eval_policy(same, policy) is policy
    greedy_cfg = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"temperature": 0.0})})
    greedy = eval_policy(greedy_cfg, policy)
    assert greedy.sampler is not sampler and greedy.sampler.temperature == 0.0
    assert greedy.sampler.model is tiny.model and greedy.sampler._model_lock is sampler._model_lock
    assert greedy.sampler.policy_version == 5 and sampler.temperature == 1.0
    assert dataclasses.replace(greedy, sampler=sampler) == policy  # renderer, parser, id kept


def test_a_sampler_with_one_temperature_is_refused_with_the_key_to_change(tiny):
    policy = Policy.from_bundle(tiny, SimpleNamespace(temperature=1.0))
    cfg = RunConfig.model_validate({"eval": {"temperature": 0}})
    with pytest.raises(ConfigError, match=r"eval\.temperature=0"):
        eval_policy(cfg, policy)


@pytest.mark.parametrize(
    "override, says",
    [
        ("eval.temperature=-1", "eval.temperature: Input should be greater than or equal to 0"),
        ("eval.samples_per_task=0", "eval.samples_per_task"),
        ("model.temperature=0", "model.temperature"),  # training never samples greedily
    ],
)
def test_the_config_refuses(override, says):
    with pytest.raises(ConfigError, match=says):
        load_config("configs/learn-arithmetic.yaml", [override])


def test_ray_workers_cannot_evaluate_at_another_temperature():
    with pytest.raises(ConfigError, match=r"eval\.temperature=0\.0: Ray rollout workers"):
        load_config(
            "configs/learn-arithmetic.yaml",
            ["trainer.rollout.backend=ray", "eval.temperature=0"],
        )
    cfg = load_config(
        "configs/learn-arithmetic.yaml", ["trainer.rollout.backend=ray", "eval.temperature=1.0"]
    )
    assert cfg.eval.temperature == cfg.model.temperature
