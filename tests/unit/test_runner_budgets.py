"""The episode runner's budgets: the terminal reserve, write guards, marginal gain, caps."""

from __future__ import annotations

import asyncio

import pytest

from tracerl.envs import InfraError, ToolEnv, ToolResult, get_parser, make, tool
from tracerl.rollout import ScriptedSampler
from tracerl.rollout.budget import (
    Budgets,
    MarginalGainStop,
    RetryPolicy,
    RolloutConfig,
    TerminalReserve,
)
from tracerl.rollout.groups import rollout_metrics
from tracerl.rollout.runner import Policy, run_episode
from tracerl.types import Source, StopReason

P = get_parser("json_list")


class Library(ToolEnv):
    """A read-only test env: pages to read, a flaky service, a write to check guards."""

    name, version = "library", "0.1"

    def __init__(self, fail_times: int = 0, **kw):
        super().__init__(**kw)
        self.fail_times = fail_times
        self.shelved: list[int] = []

    @tool(version="1")
    def read(self, page: int):
        """Read a page.

        Args:
            page: page number.
        """
        text = "lorem ipsum " * 3000 if page == 99 else f"page {page}"
        return ToolResult(text, evidence={"gain": 0.6 if page == 1 else 0.01})

    @tool(version="1")
    def flaky(self) -> str:
        """A service that fails a few times first."""
        if self.fail_times > 0:
            self.fail_times -= 1
            raise InfraError("503 Service Unavailable")
        return "fine"

    @tool(effect="write", version="1")
    def shelve(self, page: int, dry_run: bool = False) -> str:
        """Shelve a page.

        Args:
            page: page number.
        """
        self.shelved.append(page)
        return "shelved"

    async def setup(self, task, seed):
        return [{"role": "user", "content": task["prompt"]}]

    def sample_tasks(self, n, *, seed=0, split="train"):
        return [{"id": f"t{i}", "prompt": "Read page 1."} for i in range(n)]


def _run(tiny, texts, config, env=None, task=None, **kw):
    sampler = ScriptedSampler.from_texts(tiny.renderer, texts)
    policy = Policy(sampler, tiny.renderer, P, "tiny-random")
    env = env or Library()
    task = task or {"id": "t", "prompt": "Read page 1."}
    return asyncio.run(run_episode(env, task, policy, config, seed=1, **kw))


READ = P.format_calls([("read", {"page": 2})])
EXPLORER = [READ] * 10  # never answers on its own


def _told(turn_texts):
    """An agent that explores until told to finalize, then answers."""

    def turn(request):
        return turn_texts(request)

    return turn


def test_reserve_routes_to_finalize_and_the_instruction_is_environment_text(tiny):
    cfg = RolloutConfig(budgets=Budgets(steps=4), reserve=TerminalReserve(min_steps_for_finalize=1))
    ep = _run(tiny, EXPLORER, cfg)
    assert ep.stop_reason is StopReason.RESERVE_REACHED
    assert ep.receipt.ledger["finalize"] == "reserve_reached"
    step = next(s for s in ep.steps if s.get("finalize"))
    assert step["step"] == 2  # after 3 of 4 steps, 1 remains = the reserve
    traj = ep.trajectories[0]
    instruction = [
        s for s in traj.segments if s.source is Source.ENVIRONMENT and "Budget nearly" in s.text
    ]
    assert instruction and all(m == 0 for s in instruction for m in s.loss_mask)
    refused = ep.steps[-1]["calls"][0]
    assert refused["observation"]["status"] == "forbidden_tool" and refused["policy_error"]
    m = rollout_metrics([ep])
    assert m["rollout/unfinished_after_budget"] == 1 and m["rollout/premature_stop_rate"] == 0


def test_the_reserve_lets_an_obedient_agent_finish_where_a_hard_cap_cuts_it_off(tiny):
    def obedient(request, *, turns=[]):  # noqa: B006 - per-call history
        prompt = tiny.renderer.decode(request.prompt_ids[-80:])
        return "Page 2 says: page 2." if "Budget nearly" in prompt else READ

    def run(reserve):
        sampler = ScriptedSampler.from_texts(tiny.renderer, obedient)
        policy = Policy(sampler, tiny.renderer, P, "tiny-random")
        cfg = RolloutConfig(budgets=Budgets(steps=4), reserve=reserve)
        return asyncio.run(run_episode(Library(), {"id": "t", "prompt": "p"}, policy, cfg))

    managed, capped = run(TerminalReserve(min_steps_for_finalize=1)), run(None)
    assert managed.stop_reason is StopReason.ANSWERED and managed.steps[-1]["action"]["answer"]
    assert capped.stop_reason is StopReason.MAX_STEPS
    m = rollout_metrics([managed, capped])
    assert m["rollout/premature_stop_rate"] == 0.5 and m["stop/answered"] == 0.5


def test_a_write_task_without_its_reserve_is_blocked_before_it_starts(tiny):
    cfg = RolloutConfig(budgets=Budgets(write_actions=0))
    task = {"id": "w", "prompt": "Shelve page 1.", "effect": "write"}
    ep = _run(tiny, EXPLORER, cfg, task=task)
    assert ep.stop_reason is StopReason.WRITE_BLOCKED
    assert ep.trajectories[0].count(Source.POLICY) == 0 and not ep.gradient_eligible
    tight = RolloutConfig(budgets=Budgets(steps=1), reserve=TerminalReserve())
    assert _run(tiny, EXPLORER, tight, task=task).stop_reason is StopReason.WRITE_BLOCKED


def test_commit_reserve_keeps_a_tool_call_for_the_write(tiny):
    cfg = RolloutConfig(
        budgets=Budgets(steps=8, tool_calls=3, write_actions=1),
        reserve=TerminalReserve(min_steps_for_finalize=1, min_tool_calls_for_commit=1),
    )
    shelve = P.format_calls([("shelve", {"page": 1})])
    task = {"id": "w", "prompt": "Shelve page 1.", "effect": "write"}
    ep = _run(tiny, [READ, READ, READ, shelve, "Shelved."], cfg, task=task)
    statuses = [c["observation"]["status"] for s in ep.steps for c in s.get("calls", [])]
    assert statuses == ["ok", "ok", "forbidden_tool", "ok"]
    # Two reads leave one call: the commit reserve. Exploration closes with the instruction.
    assert ep.steps[1]["finalize"] == "reserve_reached"
    assert "exploration is closed" in ep.steps[2]["calls"][0]["result"]["content"]
    assert ep.steps[3]["calls"][0]["result"]["dry_run"] is True  # the guard: a dry run
    assert ep.stop_reason is StopReason.ANSWERED


def test_writes_are_guarded(tiny):
    shelve = P.format_calls([("shelve", {"page": 1})])
    read_task = _run(tiny, [shelve, "ok"], RolloutConfig())
    call = read_task.steps[0]["calls"][0]
    assert call["observation"]["status"] == "forbidden_tool"
    assert "permits no write" in call["result"]["content"]
    task = {"id": "w", "prompt": "Shelve page 1.", "effect": "write"}
    twice = _run(tiny, [shelve, shelve, "ok"], RolloutConfig(), task=task)
    assert twice.stop_reason is StopReason.WRITE_BLOCKED
    assert [c["observation"]["status"] for s in twice.steps for c in s["calls"]] == [
        "ok",
        "forbidden_tool",
    ]


def test_marginal_gain_stop(tiny):
    first = P.format_calls([("read", {"page": 1})])
    cfg = RolloutConfig(marginal_gain=MarginalGainStop(threshold=0.05, patience=2))
    ep = _run(tiny, [first, *EXPLORER], cfg)
    gains = [e["evidence_gain"] for e in ep.receipt.ledger["events"]]
    assert gains[:3] == [0.6, 0.01, 0.01]
    assert ep.receipt.ledger["finalize"] == "marginal_evidence_gain_below_threshold"
    assert ep.stop_reason is StopReason.MARGINAL_GAIN
    no_reserve = cfg.model_copy(update={"reserve": None})
    cut = _run(tiny, [first, *EXPLORER], no_reserve)
    assert cut.stop_reason is StopReason.MARGINAL_GAIN and len(cut.steps) == 3


def test_huge_tool_output_is_truncated_visibly(tiny):
    huge = P.format_calls([("read", {"page": 99})])
    ep = _run(tiny, [huge, "done"], RolloutConfig(observation_max_tokens=64))
    call = ep.steps[0]["calls"][0]
    assert call["observation"]["truncated"] is True
    content = ep.steps[0]["observation_messages"][0]["content"]
    assert "[... output truncated: showing 64 of" in content
    env_tokens = sum(
        len(s.token_ids) for s in ep.trajectories[0].segments if s.source is Source.ENVIRONMENT
    )
    assert env_tokens < 64 + 40


@pytest.mark.parametrize(
    ("budgets", "extra", "stop"),
    [
        (Budgets(sampled_tokens=40), {}, StopReason.MAX_TOKENS),
        (Budgets(context_tokens=400), {}, StopReason.CONTEXT_OVERFLOW),
        (Budgets(steps=20, tool_calls=2), {"reserve": None}, StopReason.MAX_TOOL_CALLS),
        (Budgets(wall_time_s=5), {"clock": lambda step: 2.0 * step}, StopReason.TIMEOUT),
    ],
)
def test_budget_stops(tiny, budgets, extra, stop):
    clock = extra.pop("clock", None)
    cfg = RolloutConfig(budgets=budgets, **extra)
    ep = _run(tiny, EXPLORER, cfg, clock=clock)
    assert ep.stop_reason is stop
    # Wall time measures the machine as much as the policy: a timeout is never its signal.
    assert ep.gradient_eligible is (stop is not StopReason.TIMEOUT)
    assert ep.receipt.ledger["stop_reason"] == stop.value
    traj = ep.trajectories[0]
    assert sum(traj.loss_mask) == ep.receipt.ledger["used"]["sampled_tokens"]


def test_parse_error_limit(tiny):
    ep = _run(tiny, ["<tool_call>[{"] * 5, RolloutConfig(max_parse_errors=3))
    assert ep.stop_reason is StopReason.PARSE_ERROR_LIMIT and len(ep.steps) == 3
    assert all(s["policy_error"] and s["reward"]["attribution"] == "policy" for s in ep.steps)
    assert ep.gradient_eligible  # a policy mistake is a signal, not noise


def test_retries_with_backoff_then_recover_or_give_up(tiny):
    flaky = P.format_calls([("flaky", {})])
    delays = []

    async def fake_sleep(s):
        delays.append(s)

    retry = RetryPolicy(max_retries=2, backoff_s=0.1, backoff_factor=3.0)
    ok = _run(
        tiny,
        [flaky, "fine"],
        RolloutConfig(retry=retry),
        env=Library(fail_times=2),
        sleep=fake_sleep,
    )
    assert ok.stop_reason is StopReason.ANSWERED and ok.gradient_eligible
    assert delays == pytest.approx([0.1, 0.3]) and len(ok.steps[0]["attempts"]) == 3
    dead = _run(
        tiny,
        [flaky, "fine"],
        RolloutConfig(retry=retry),
        env=Library(fail_times=9),
        sleep=fake_sleep,
    )
    assert dead.stop_reason is StopReason.INFRA_FAILURE
    assert dead.attribution.value == "environment" and not dead.gradient_eligible
    assert dead.receipt.steps[0]["exception"] == "InfraError"


def test_a_failed_reset_is_an_infra_failure_with_a_receipt(tiny):
    class Down(Library):
        async def setup(self, task, seed):
            raise ConnectionRefusedError("db down")

    ep = _run(tiny, EXPLORER, RolloutConfig(), env=Down())
    assert ep.stop_reason is StopReason.INFRA_FAILURE and ep.attribution.value == "environment"
    assert "db down" in ep.receipt.error and len(ep.trajectories) == 1


def test_refund_desk_guard_never_refunds_for_real_unless_the_task_allows_it(tiny):
    desk = make("refund_desk")
    task = next(t for t in desk.sample_tasks(40, seed=0) if t["expected"]["action"] == "refund")
    refund = P.format_calls(
        [("issue_refund", {"order_id": task["order_id"], "amount": task["amount"]})]
    )
    ep = _run(tiny, [refund, "done"], RolloutConfig(), env=desk, task=task)
    assert desk.snapshot() == {} and ep.steps[0]["calls"][0]["result"]["dry_run"]
    assert ep.steps[0]["calls"][0]["result"]["effect"]["refund"]["amount"] == task["amount"]
    assert ep.receipt.ledger["side_effect_guard"] == "dry_run"
    off = make("refund_desk", side_effect_guard="off")
    _run(tiny, [refund, "done"], RolloutConfig(), env=off, task=task)
    assert off.snapshot() == {}  # guard off, but the task gave no allowance
    tenant = make("refund_desk", side_effect_guard="off")
    _run(
        tiny,
        [refund, "done"],
        RolloutConfig(),
        env=tenant,
        task={**task, "allow_real_writes": True},
    )
    assert tenant.snapshot() == {task["order_id"]: task["amount"]}


def test_a_retry_resends_only_the_failed_calls(tiny):
    """A write that went through is not repeated because a neighbouring call failed."""
    both = P.format_calls([("shelve", {"page": 4}), ("flaky", {})])
    env = Library(fail_times=1)
    task = {"id": "w", "prompt": "p", "effect": "write"}
    retry = RetryPolicy(max_retries=2, backoff_s=0.0)
    ep = _run(tiny, [both, "ok"], RolloutConfig(retry=retry), env=env, task=task)
    assert env.shelved == [4]  # once, not once per attempt
    step = ep.steps[0]
    assert [len(a["calls"]) for a in step["attempts"]] == [2, 1] and step["retried"] == 1
    assert [c["observation"]["status"] for c in step["calls"]] == ["ok", "ok"]
    assert not step["infra_error"] and ep.gradient_eligible


def test_an_evaluator_fault_is_nobodys_signal(tiny):
    from tracerl.types import Fault, FaultKind

    class Graded(Library):
        @tool(version="1")
        def grade(self) -> ToolResult:
            """Grade the work so far."""
            fault = Fault(FaultKind.EVALUATOR_CRASHED, "grader raised ZeroDivisionError")
            return ToolResult("grader unavailable", error=fault)

    ep = _run(tiny, [P.format_calls([("grade", {})]), "ok"], RolloutConfig(), env=Graded())
    assert ep.attribution.value == "evaluator" and not ep.gradient_eligible


def test_a_crashing_episode_is_kept_and_attributed_unknown(tiny, caplog):
    class Broken(Library):
        @tool(version="1")
        def read(self, page: int):
            """Read a page.

            Args:
                page: page number.
            """
            return ToolResult(None)  # a bug: content must be text

    ep = _run(tiny, [READ, "ok"], RolloutConfig(), env=Broken())
    assert ep.stop_reason is StopReason.INFRA_FAILURE and ep.attribution.value == "unknown"
    assert not ep.gradient_eligible and "TypeError" in ep.receipt.error
    assert ep.trajectories[0].count(Source.POLICY) > 0  # what was sampled is kept
    assert "crashed" in caplog.text


def test_a_write_the_tool_refused_does_not_spend_the_write_budget(tiny):
    bad = P.format_calls([("shelve", {"page": "first"})])
    good = P.format_calls([("shelve", {"page": 1})])
    env = Library()
    task = {"id": "w", "prompt": "p", "effect": "write"}
    ep = _run(tiny, [bad, good, "ok"], RolloutConfig(), env=env, task=task)
    statuses = [c["observation"]["status"] for s in ep.steps for c in s.get("calls", [])]
    assert statuses == ["invalid_arguments", "ok"] and env.shelved == [1]
    assert ep.stop_reason is StopReason.ANSWERED
    assert ep.receipt.ledger["used"]["write_actions"] == 1
    assert ep.receipt.ledger["used"]["tool_calls"] == 2


@pytest.mark.parametrize(
    ("budgets", "turn_tokens", "stop"),
    [
        (Budgets(context_tokens=160), 256, StopReason.CONTEXT_OVERFLOW),  # the context's end
        (Budgets(context_tokens=4096), 20, StopReason.MAX_TOKENS),  # the turn's own cap
    ],
)
def test_an_answer_cut_off_says_which_limit_cut_it(tiny, budgets, turn_tokens, stop):
    """A long answer cut short where the context ends is an overflow (a context policy's
    business, and what readiness reports), not the turn's own token cap."""
    long_answer = "the answer is " + "very " * 300
    cfg = RolloutConfig(budgets=budgets, max_turn_tokens=turn_tokens, reserve=None)
    ep = _run(tiny, [long_answer], cfg)
    assert ep.stop_reason is stop


@pytest.mark.parametrize(
    ("held", "text", "cut_at"),
    [
        ("an answer", "the answer is " + "very " * 300, 40),
        ("half a tool call", READ, 12),  # cut inside its JSON: unreadable
        ("a whole tool call, then more", READ + " and then " + "more " * 300, None),
    ],
)
def test_a_turn_the_context_cut_ends_context_overflow_whatever_it_held(tiny, held, text, cut_at):
    """One rule (docs/long-horizon.md): a turn cut off where the context ends stops the
    episode ``context_overflow`` — nothing parsed or run, no format mistake counted (with
    ``max_parse_errors: 1`` a cut tool call used to end ``parse_error_limit``)."""
    prompt = len(
        _run(tiny, ["x"], RolloutConfig(reserve=None)).trajectories[0].segments[0].token_ids
    )
    call = len(tiny.renderer.encode(READ, content=True))
    room = cut_at if cut_at is not None else call + 4  # past the call's closing tag
    cfg = RolloutConfig(
        budgets=Budgets(context_tokens=prompt + room),
        max_turn_tokens=256,
        reserve=None,
        max_parse_errors=1,
    )
    ep = _run(tiny, [text], cfg)
    traj = ep.trajectories[0]
    assert sum(traj.loss_mask) < len(tiny.renderer.encode(text, content=True))  # it was cut
    assert ep.stop_reason is StopReason.CONTEXT_OVERFLOW, (held, ep.stop_reason)
    assert ep.receipt.ledger["used"]["tool_calls"] == 0  # a cut call is never run
    assert not any(s["policy_error"] or s.get("fault") for s in ep.steps), ep.steps
