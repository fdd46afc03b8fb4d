"""Long horizons in training, on the tiny model: GRPO steps over `timeline` episodes that
compact (policy-written summaries) or delegate (sub-agents), played by the environment's
reference agent. Every sample of an episode trains with the episode's advantage (a
summarize turn and a sub-agent's turns included), each episode counts once in its group,
and what the run writes reads back as one episode per member."""

from __future__ import annotations

import copy
from collections import defaultdict

import pytest
import torch

from tracerl.envs import make
from tracerl.envs.parsers import parser_for_model
from tracerl.envs.timeline import Timeline
from tracerl.rollout.budget import Budgets, RolloutConfig
from tracerl.rollout.context import ContextConfig, SubagentConfig, SummarizerConfig
from tracerl.rollout.persist import EpisodeWriter, read_run_trajectories
from tracerl.rollout.reference import reference_policy
from tracerl.rollout.runner import Policy
from tracerl.train import padded_batch, token_logprobs
from tracerl.train.grpo import GRPOConfig, grpo_step
from tracerl.train.learner import Learner, LearnerConfig

BUDGETS = Budgets(steps=12, tool_calls=12, context_tokens=512, sampled_tokens=1024)
COMPACT = RolloutConfig(
    budgets=BUDGETS,
    max_turn_tokens=48,
    observation_max_tokens=80,
    reserve=None,
    context=ContextConfig(
        policy="compact", keep_turns=0, summarizer=SummarizerConfig(max_tokens=48)
    ),
)
DELEGATE = RolloutConfig(
    budgets=BUDGETS.model_copy(update={"steps": 6}),
    max_turn_tokens=64,
    observation_max_tokens=80,
    reserve=None,
    subagents=SubagentConfig(steps=6),
)
VARIANTS = {"compact": ({}, COMPACT), "delegate": ({"delegate": True}, DELEGATE)}


def favoured(episode) -> float:
    """Members g0 and g2 of each group are the right ones (see `Members`)."""
    return float(episode.episode_id.endswith(("g0", "g2")))


class Misread(Timeline):
    """A reference agent that misreads every year (its summaries and answers say 1000)."""

    def sample_tasks(self, n, *, seed=0, split="train"):
        return [self._misread(t) for t in super().sample_tasks(n, seed=seed, split=split)]

    @staticmethod
    def _misread(task):
        years = ["1000"] * len(task["years"])
        return {**task, "years": years, "answers": [" ".join(years)]}


class Members:
    """Members g0 and g2 play the reference agent, g1 and g3 one that misreads: the group's
    members differ exactly where the reward does."""

    policy_version = 0

    def __init__(self, right, wrong):
        self.right, self.wrong = right, wrong

    async def sample(self, request):
        root = (request.episode_id or "").split("/")[0]
        chosen = self.right if root.endswith(("g0", "g2")) else self.wrong
        return await chosen.sampler.sample(request)


def _answer_logprob(model, trajectories):
    """The log-probability of each trajectory's last model turn (its answer)."""
    b = padded_batch(trajectories, [0.0] * len(trajectories))
    with torch.no_grad():
        lp = token_logprobs(model, b.input_ids_B_T, b.attention_mask_B_T)
    out = []
    for row, t in enumerate(trajectories):
        last = [s for s in t.segments if s.source.value == "policy"][-1]
        end = sum(len(s.token_ids) for s in t.segments[: t.segments.index(last) + 1])
        out.append(float(lp[row, end - len(last.token_ids) : end].sum()))
    return out


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_grpo_trains_every_sample_of_long_episodes_once_per_episode(tiny, tmp_path, variant):
    kwargs, rollout = VARIANTS[variant]
    probe = make("timeline", **kwargs)
    tasks = probe.sample_tasks(2, seed=1)
    parser = parser_for_model("smollm2-135m-instruct")
    instruction = rollout.context.summarizer.instruction if variant == "compact" else None
    right = reference_policy(tiny.renderer, "tiny-random", probe, tasks, parser, instruction)
    misread = Misread(**kwargs)
    wrong_tasks = [Misread._misread(t) for t in tasks]
    wrong = reference_policy(
        tiny.renderer, "tiny-random", misread, wrong_tasks, parser, instruction
    )
    policy = Policy(Members(right, wrong), tiny.renderer, parser, "tiny-random")
    model = copy.deepcopy(tiny.model)
    learner = Learner(model, LearnerConfig(lr=1e-3, micro_batch_tokens=4096))
    cfg = GRPOConfig(group_size=4, rollout=rollout)

    def env():
        return make("timeline", **kwargs)

    m, episodes = grpo_step(
        env, tasks, policy, learner, favoured, cfg, step=0, writer=EpisodeWriter(tmp_path, 0)
    )
    assert len(episodes) == 8 and all(e.gradient_eligible for e in episodes)
    assert all(e.stop_reason.value == "answered" for e in episodes)
    if variant == "compact":
        assert m["context/compaction_rate"] == 1.0 and m["context/summary_tokens_mean"] > 0
    else:
        assert m["context/subagents_mean"] == 2.0
        assert all({t.agent for t in e.trajectories} == {"", "d0", "d1"} for e in episodes)
        # timeline grades each sub-agent on its own range: the misreading members' children
        # score 0, the others' 1, and they train with advantages of their own
        graded = [r["reward"] for e in episodes for r in e.receipt.children]
        assert sorted(graded) == [0.0] * 8 + [1.0] * 8
        assert m["train/subagent_reward_mean"] == 0.5
    assert m["context/samples_per_episode"] >= 3
    # every sampled token of every sample trained (a summary, a sub-agent's turns)
    assert m["train/policy_tokens"] == sum(
        sum(t.loss_mask) for e in episodes for t in e.trajectories
    )

    # what was written reads back as one episode per member, all its samples together
    by_episode = defaultdict(list)
    for _, t in read_run_trajectories(tmp_path):
        by_episode[t.episode_id].append(t)
    assert len(by_episode) == 8
    assert sorted(len(v) for v in by_episode.values()) == sorted(
        len(e.trajectories) for e in episodes
    )

    # the episode's advantage reached its later samples too: the answer in a rewarded
    # member's last sample (after a compaction, or a sub-agent's) became more likely, the
    # misread one less
    up = next(e for e in episodes if favoured(e)).trajectories[-1]
    down = next(e for e in episodes if not favoured(e)).trajectories[-1]
    assert up.token_ids != down.token_ids
    before = _answer_logprob(model, [up, down])
    for step in range(1, 3):
        grpo_step(env, tasks, policy, learner, favoured, cfg, step=step)
    after = _answer_logprob(model, [up, down])
    assert after[0] > before[0] and after[1] < before[1]
