"""Sub-agents (``rollout.subagents``): a delegate call runs a child episode of the same
policy; its samples are the parent episode's (policy tokens with loss, its prompt without),
the parent pays for it, failures keep their owner, receipts link both ways, and replay
(exact and live) runs the tree again."""

from __future__ import annotations

import asyncio
import json

import pytest

from tracerl.envs import InfraError, ToolEnv, get_parser, tool
from tracerl.envs.delegation import Delegating
from tracerl.rollout import ScriptedSampler
from tracerl.rollout.budget import Budgets, RolloutConfig
from tracerl.rollout.context import SubagentConfig
from tracerl.rollout.episode import episode_from_trajectories
from tracerl.rollout.live_replay import replay_live
from tracerl.rollout.replay import replay_exact
from tracerl.rollout.runner import Policy, run_episode
from tracerl.train.grpo import row_shares
from tracerl.types import Attribution, Source, StopReason, Trajectory

P = get_parser("json_list")
SUBTASK = "Read pages 1 and 2 and answer with the numbers they give."
ROOT_ID = "t:s0"


class Archive(Delegating, ToolEnv):
    name, version = "archive", "0.1"

    def __init__(self, broken: bool = False, drift: bool = False, **kw):
        super().__init__(**kw)
        self.broken, self.drift = broken, drift

    @tool(version="1")
    def read(self, page: int) -> str:
        """Read a page.

        Args:
            page: page number.
        """
        if self.broken:
            raise InfraError("503 archive unavailable")
        return f"page {page} gives the number {page * (11 if self.drift else 10)}"

    async def setup(self, task, seed):
        return [{"role": "user", "content": "What do pages 1 and 2 give? Delegate the reading."}]

    def sample_tasks(self, n, *, seed=0, split="train"):
        return [{"id": f"t{i}"} for i in range(n)]


def delegate(text=SUBTASK):
    return P.format_calls([("delegate", {"task": text})])


ROOT = [delegate(), "Pages 1 and 2 give 10 and 20."]
CHILD = [
    P.format_calls([("read", {"page": 1})]),
    P.format_calls([("read", {"page": 2})]),
    "10 20",
]


def scripted(tiny, root=ROOT, child=CHILD):
    def turn(request):
        script = child if "/d" in (request.episode_id or "") else root
        return script[min(request.turn, len(script) - 1)]

    return Policy(ScriptedSampler.from_texts(tiny.renderer, turn), tiny.renderer, P, "tiny-random")


ON = SubagentConfig()


def run(tiny, env=None, sub=ON, policy=None, turn_tokens=48, **budgets):
    cfg = RolloutConfig(
        budgets=Budgets(**{"steps": 4, **budgets}),
        reserve=None,
        subagents=sub,
        max_turn_tokens=turn_tokens,
    )
    task = {"id": "t"}
    policy = policy or scripted(tiny)
    return asyncio.run(run_episode(env or Archive(), task, policy, cfg, seed=0, episode_id=ROOT_ID))


def policy_text(t: Trajectory) -> str:
    return "".join(s.text or "" for s in t.segments if s.source is Source.POLICY)


def test_a_delegate_call_runs_a_child_whose_answer_the_parent_sees(tiny):
    ep = run(tiny)
    assert ep.stop_reason is StopReason.ANSWERED and ep.attribution is Attribution.POLICY
    root = [t for t in ep.trajectories if not t.agent]
    kids = [t for t in ep.trajectories if t.agent]
    assert len(root) == 1 and [t.agent for t in kids] == ["d0"]
    assert [t.sample_index for t in ep.trajectories] == [0, 1]
    assert {t.episode_id for t in ep.trajectories} == {ROOT_ID}  # one episode, two samples
    child = kids[0]
    # the child's turns are policy tokens with loss; its prompt (the sub-task) has none
    assert "10 20" in policy_text(child) and '"read"' in policy_text(child)
    first = next(i for i, m in enumerate(child.loss_mask) if m)
    assert SUBTASK in tiny.renderer.decode(child.token_ids[:first])
    # the parent sees the child's answer as the delegate call's tool output (no loss)
    env_text = "".join(s.text or "" for s in root[0].segments if s.source is Source.ENVIRONMENT)
    assert "10 20" in env_text and "10 20" not in policy_text(root[0]).split("</tool_call>")[0]
    # the receipts link both ways; the parent paid for the child
    (rec,) = ep.receipt.children
    assert rec["agent"] == "d0" and rec["step"] == 0 and rec["answer"] == "10 20"
    assert rec["stop_reason"] == "answered" and rec["tool_calls"] == 2
    assert child.receipt["parent"] == {
        "episode_id": ROOT_ID,
        "replay_id": ep.receipt.replay_id,
        "step": 0,
    }
    used = ep.receipt.ledger["used"]
    assert used["sampled_tokens"] == sum(sum(t.loss_mask) for t in ep.trajectories)
    assert used["tool_calls"] == 3  # the delegate call and the child's two reads
    assert row_shares(ep, "episode") == [0.5, 0.5]  # one episode, two samples


def test_the_run_directory_keeps_the_tree_as_one_episode(tiny, tmp_path):
    ep = run(tiny)
    lines = [json.dumps(t.to_dict()) for t in ep.trajectories]
    back = episode_from_trajectories([Trajectory.from_dict(json.loads(x)) for x in lines])
    assert back.receipt.children == ep.receipt.children
    assert [t.agent for t in back.trajectories] == ["", "d0"]
    assert [s["step"] for s in back.steps] == [s["step"] for s in ep.steps]  # the root's steps


def test_exact_replay_reproduces_the_tree_and_live_replay_finds_drift_in_a_child(tiny):
    ep = run(tiny)
    report = asyncio.run(replay_exact(ep.trajectories, renderer=tiny.renderer))
    assert report.ok, report.first_difference
    live = asyncio.run(replay_live(ep.trajectories, Archive(drift=True)))
    assert [d.step for d in live.drifted] == ["d0:0", "d0:1"]
    assert "page 1 gives the number 10" in live.drifted[0].detail
    same = asyncio.run(replay_live(ep.trajectories, Archive()))
    assert same.drifted == []


def test_a_childs_outage_is_the_environments_in_the_parent(tiny):
    ep = run(tiny, env=Archive(broken=True))
    (rec,) = ep.receipt.children
    assert rec["attribution"] == "environment"
    assert ep.attribution is Attribution.ENVIRONMENT and not ep.gradient_eligible
    call = ep.steps[0]["calls"][0]
    assert call["infra_error"] and "sub-agent d0" in call["result"]["error"]["message"]


def test_a_child_that_spends_its_budget_is_a_policy_outcome(tiny):
    reads_forever = [P.format_calls([("read", {"page": 1})])]
    ep = run(tiny, sub=SubagentConfig(steps=2), policy=scripted(tiny, child=reads_forever))
    (rec,) = ep.receipt.children
    assert rec["stop_reason"] == "max_steps" and rec["answer"] is None
    assert ep.attribution is Attribution.POLICY and ep.gradient_eligible
    obs = ep.steps[0]["observation_messages"][0]["content"]
    assert obs == "(the sub-agent stopped without an answer: max_steps)"


def test_a_child_cannot_delegate_again_at_depth_one(tiny):
    nested = [delegate("Read page 1."), "nothing"]
    ep = run(tiny, policy=scripted(tiny, child=nested))
    child_steps = [s for t in ep.trajectories if t.agent for s in t.steps]
    assert child_steps[0]["calls"][0]["observation"]["status"] == "forbidden_tool"
    told = child_steps[0]["observation_messages"][0]["content"]
    assert "cannot delegate further (max_depth 1)" in told
    assert len(ep.receipt.children) == 1


def test_at_depth_two_a_child_delegates_and_replay_runs_the_whole_tree(tiny):
    scripts = {
        "": ROOT,
        "d0": [delegate("Read page 1."), "10 20"],
        "d0/d0": [P.format_calls([("read", {"page": 1})]), "10"],
    }

    def turn(request):
        agent = (request.episode_id or "")[len(ROOT_ID) + 1 :]
        script = scripts[agent]
        return script[min(request.turn, len(script) - 1)]

    policy = Policy(ScriptedSampler.from_texts(tiny.renderer, turn), tiny.renderer, P, "t")
    ep = run(tiny, sub=SubagentConfig(max_depth=2), policy=policy)
    assert [t.agent for t in ep.trajectories] == ["", "d0", "d0/d0"]
    child = next(t for t in ep.trajectories if t.agent == "d0")
    assert [c["agent"] for c in child.receipt["children"]] == ["d0/d0"]
    assert ep.receipt.ledger["used"]["tool_calls"] == 3  # two delegate calls and one read
    report = asyncio.run(replay_exact(ep.trajectories, renderer=tiny.renderer))
    assert report.ok, report.first_difference
    live = asyncio.run(replay_live(ep.trajectories, Archive(drift=True)))
    assert [d.step for d in live.drifted] == ["d0/d0:0"]


def test_without_subagents_the_delegate_tool_says_delegation_is_off(tiny):
    ep = run(tiny, sub=None)
    assert ep.receipt.children == [] and len(ep.trajectories) == 1
    call = ep.steps[0]["calls"][0]
    assert (
        call["policy_error"]
        and "rollout.subagents" in ep.steps[0]["observation_messages"][0]["content"]
    )


@pytest.mark.parametrize("text", ["", "   "])
def test_an_empty_sub_task_is_the_policys_mistake(tiny, text):
    ep = run(tiny, policy=scripted(tiny, root=[delegate(text), "done"]))
    assert ep.receipt.children == []
    assert ep.steps[0]["calls"][0]["observation"]["status"] == "invalid_arguments"


def test_show_names_a_sub_agents_samples(tiny):
    from tracerl.report.run import sample_origin

    ep = run(tiny)
    assert sample_origin(ep.trajectories, 1) == "sub-agent d0: first sample"


def test_turn_credit_places_a_sub_agents_turns_at_the_step_that_delegated(tiny):
    from tracerl.train.turn_credit import episode_turns

    ep = run(tiny)
    turns = episode_turns(ep)
    child = [t for t in turns if t["sample"] == 1]
    assert len(child) == 3 and {t["step"] for t in child} == {0}  # the delegate call's step
    assert all(t["reward"] == 0.0 for t in child)  # a step's reward is paid to its own turn
    assert [t["step"] for t in turns if t["sample"] == 0] == [0, 1]


def test_a_child_cannot_spend_the_calls_its_parents_step_still_needs(tiny):
    both = P.format_calls([("delegate", {"task": "Read page 1."}), ("read", {"page": 3})])
    ep = run(tiny, policy=scripted(tiny, root=[both, "done"]), tool_calls=2, turn_tokens=96)
    (rec,) = ep.receipt.children
    assert rec["tool_calls"] == 0  # the delegate call and the read took both
    assert ep.receipt.ledger["used"]["tool_calls"] == 2


class Framed(Archive):
    """Says which sub-task an answer answers, as the environment's own words."""

    def subagent_result(self, task, subtask, answer):
        return f"Pages 1-2 (task {task['id']}): {answer}"


class BadFrame(Archive):
    def __init__(self, value, **kw):
        super().__init__(**kw)
        self.value = value

    def subagent_result(self, task, subtask, answer):
        if isinstance(self.value, Exception):
            raise self.value
        return self.value


def test_the_environment_may_frame_the_childs_answer_in_words_without_loss(tiny):
    ep = run(tiny, env=Framed())
    root = next(t for t in ep.trajectories if not t.agent)
    obs = ep.steps[0]["observation_messages"][0]["content"]
    assert obs == "Pages 1-2 (task t): 10 20"
    env_text = "".join(s.text or "" for s in root.segments if s.source is Source.ENVIRONMENT)
    assert "Pages 1-2 (task t): 10 20" in env_text  # the environment's tokens: no loss
    assert "Pages 1-2" not in policy_text(root)
    (rec,) = ep.receipt.children
    assert rec["answer"] == "10 20"  # the receipt keeps what the child wrote, and what was shown
    assert rec["result"] == "Pages 1-2 (task t): 10 20"
    report = asyncio.run(replay_exact(ep.trajectories, renderer=tiny.renderer))
    assert report.ok, report.first_difference
    assert asyncio.run(replay_live(ep.trajectories, Framed())).drifted == []


@pytest.mark.parametrize(
    ("value", "said"),
    [(KeyError("years"), "subagent_result raised KeyError"), (42, "returned int 42")],
)
def test_a_framing_hook_that_fails_is_nobodys_lesson(tiny, value, said):
    ep = run(tiny, env=BadFrame(value))
    call = ep.steps[0]["calls"][0]
    assert call["observation"]["status"] == "unknown"
    assert said in call["result"]["error"]["message"]
    assert ep.attribution is not Attribution.POLICY and not ep.gradient_eligible
