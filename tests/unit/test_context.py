"""Context policies (``rollout.context``), token for token: after a compaction, no token of
the summary carries loss unless the policy wrote it, kept turns are prompt tokens of the
new sample, the receipt's record names exactly what was kept and dropped, the ledger pays
for it, and exact replay reproduces the episode."""

from __future__ import annotations

import asyncio

import pytest

from tracerl.envs import ToolEnv, get_parser, tool
from tracerl.rollout import ScriptedSampler
from tracerl.rollout.budget import Budgets, RolloutConfig
from tracerl.rollout.context import ContextConfig, SummarizerConfig
from tracerl.rollout.replay import replay_exact
from tracerl.rollout.runner import Policy, run_episode
from tracerl.types import Attribution, Source, StopReason

P = get_parser("json_list")
ASK = "Write only the summary."
SUMMARY = "SUMMARY: pages read so far hold the numbers 1 to 3."
ANSWER = "The answer is 42."
CONTEXT = 700


class Pages(ToolEnv):
    """Long pages: an episode that reads them all outgrows a small context."""

    name, version = "pages", "0.1"

    @tool(version="1")
    def read(self, page: int) -> str:
        """Read a page.

        Args:
            page: page number.
        """
        return f"page {page} says the number is {page}. " + "filler text " * 18

    async def setup(self, task, seed):
        return [{"role": "user", "content": task["prompt"]}]

    def sample_tasks(self, n, *, seed=0, split="train"):
        return [{"id": f"t{i}", "prompt": "Read every page, then answer."} for i in range(n)]


def reader(tiny, answer_at=8):
    """Reads page after page, writes a summary when asked, answers at turn `answer_at`."""

    def turn(request):
        tail = tiny.renderer.decode(request.prompt_ids[-60:])
        if ASK in tail:
            return SUMMARY
        if request.turn >= answer_at:
            return ANSWER
        return P.format_calls([("read", {"page": request.turn + 1})])

    return turn


def run(tiny, context: ContextConfig, script=None, **budgets):
    sampler = ScriptedSampler.from_texts(tiny.renderer, script or reader(tiny))
    policy = Policy(sampler, tiny.renderer, P, "tiny-random")
    cfg = RolloutConfig(
        budgets=Budgets(**{"steps": 12, "context_tokens": CONTEXT, "tool_calls": 12, **budgets}),
        max_turn_tokens=40,
        observation_max_tokens=64,
        reserve=None,
        context=context,
    )
    task = {"id": "t", "prompt": "Read every page, then answer."}
    return asyncio.run(run_episode(Pages(), task, policy, cfg, seed=3))


def spans(t, source=None):
    """The text of a trajectory's segments (of one source)."""
    return "".join(s.text or "" for s in t.segments if source is None or s.source is source)


def loss_text(t):
    return "".join(s.text or "" for s in t.segments if any(s.loss_mask))


def test_stop_ends_the_episode_when_the_context_is_full(tiny):
    ep = run(tiny, ContextConfig())
    # the turn that no longer fits is cut by the context (or never starts)
    assert ep.stop_reason in (StopReason.CONTEXT_OVERFLOW, StopReason.MAX_TOKENS)
    assert len(ep.trajectories) == 1 and ANSWER not in spans(ep.trajectories[0])
    assert ep.receipt.compactions == []


def test_a_policy_summary_trains_and_the_new_sample_starts_from_it(tiny):
    ep = run(tiny, ContextConfig(policy="compact", summarizer=SummarizerConfig(instruction=ASK)))
    assert ep.stop_reason is StopReason.ANSWERED, ep.receipt.error
    comps = ep.receipt.compactions
    assert len(ep.trajectories) == len(comps) + 1 >= 3
    for t in ep.trajectories:
        assert len(t) <= CONTEXT  # no sample outgrew the context
    sampled = sum(sum(t.loss_mask) for t in ep.trajectories)
    assert sampled == ep.receipt.ledger["used"]["sampled_tokens"]  # every sampled token, once
    for c, before, after in zip(comps, ep.trajectories, ep.trajectories[1:], strict=False):
        assert c["summary_by"] == "policy" and c["summary"] == SUMMARY
        # the summarize turn: the old sample's last policy turn, with loss
        last = [s for s in before.segments if s.source is Source.POLICY][-1]
        assert SUMMARY in last.text and all(last.loss_mask)
        # ... asked for by environment text without loss
        assert ASK in spans(before, Source.ENVIRONMENT) and ASK not in loss_text(before)
        # in the new sample, the summary and the kept turn are prompt: no loss
        first_policy = next(i for i, m in enumerate(after.loss_mask) if m)
        assert SUMMARY in tiny.renderer.decode(after.token_ids[:first_policy])
        assert c["tokens_after"] < c["tokens_before"] and c["sample"] == after.sample_index
        assert before.steps[-1]["history_break"].startswith("compaction")
    summary_tokens = sum(c["summary_tokens"] for c in comps)
    used = ep.receipt.ledger["used"]
    assert used["compactions"] == len(comps) and used["summary_tokens"] == summary_tokens
    turns = [s for t in ep.trajectories for s in t.segments if s.source is Source.POLICY]
    assert used["steps"] == len(turns) - len(comps)  # summaries are not steps


def test_the_record_names_exactly_the_messages_kept_and_dropped(tiny):
    ep = run(
        tiny,
        ContextConfig(policy="compact", keep_turns=1, summarizer=SummarizerConfig(instruction=ASK)),
    )
    first = ep.receipt.compactions[0]
    sample0, sample1 = ep.trajectories[0], ep.trajectories[1]
    # the old sample's messages: the task, then (call, tool output) per read
    reads = [s for s in sample0.steps if s.get("calls")]
    assert first["kept"] == [0, 2 * len(reads) - 1, 2 * len(reads)]  # the task, the last read
    assert first["dropped"] == list(range(1, 2 * len(reads) - 1)) and first["replaced"] == []
    prompt1 = spans(sample1, Source.PROMPT) + spans(sample1, Source.TEMPLATE)
    last_page = reads[-1]["calls"][0]["action"]["args"]["page"]
    assert f"page {last_page} says" in spans(sample1) and "page 1 says" not in spans(sample1)
    assert all(m == 0 for m in sample1.loss_mask[: len(sample1) - sum(sample1.loss_mask)][:1])
    assert prompt1  # the new sample opens with prompt tokens
    first_policy = next(i for i, m in enumerate(sample1.loss_mask) if m)
    assert f"page {last_page} says" in tiny.renderer.decode(sample1.token_ids[:first_policy])


def test_exact_replay_reproduces_compacted_episodes(tiny):
    for context in (
        ContextConfig(policy="compact", summarizer=SummarizerConfig(instruction=ASK)),
        ContextConfig(policy="drop_observations"),
    ):
        ep = run(tiny, context)
        assert len(ep.trajectories) >= 2
        report = asyncio.run(replay_exact(ep.trajectories, renderer=tiny.renderer))
        assert report.ok, report.first_difference


calls = []


def summarize_pages(messages):
    calls.append(len(messages))
    return "From the pages: " + ", ".join(
        m["content"].split(" says")[0] for m in messages if m["role"] == "tool"
    )


def test_a_configured_summarizer_writes_environment_text_that_never_trains(tiny):
    calls.clear()
    by_fn = SummarizerConfig(by="function", fn="tests.unit.test_context:summarize_pages")
    ep = run(tiny, ContextConfig(policy="compact", summarizer=by_fn))
    assert ep.stop_reason is StopReason.ANSWERED and ep.attribution is Attribution.POLICY
    comps = ep.receipt.compactions
    assert comps and len(calls) == len(comps) == ep.receipt.ledger["used"]["summarizer_calls"]
    assert comps[0]["summary"].startswith("From the pages: page 1, page 2")
    for c, t in zip(comps, ep.trajectories[1:], strict=False):
        assert (
            c["summary_by"] == "function"
            and c["summary"] in spans(t)
            and "From the pages" not in loss_text(t)
        )
    assert all("From the pages" not in loss_text(t) for t in ep.trajectories)
    assert ep.receipt.ledger["used"]["summary_tokens"] == 0  # the policy wrote none
    n = len(calls)
    report = asyncio.run(replay_exact(ep.trajectories, renderer=tiny.renderer))
    assert report.ok, report.first_difference
    assert len(calls) == n  # replay used the recorded summaries


def broken_summarizer(messages):
    raise ConnectionError("summarizer endpoint refused the connection")


def test_a_failing_summarizer_is_the_environments_failure(tiny):
    by_fn = SummarizerConfig(by="function", fn="tests.unit.test_context:broken_summarizer")
    ep = run(tiny, ContextConfig(policy="compact", summarizer=by_fn))
    assert ep.stop_reason is StopReason.INFRA_FAILURE
    assert ep.attribution is Attribution.ENVIRONMENT and not ep.gradient_eligible
    assert "summarizer failed: ConnectionError" in ep.receipt.error


def test_dropping_observations_replaces_old_tool_outputs_with_the_marker(tiny):
    ctx = ContextConfig(policy="drop_observations", keep_turns=1)
    ep = run(tiny, ctx)
    assert ep.stop_reason is StopReason.ANSWERED, ep.receipt.error
    first = ep.receipt.compactions[0]
    assert first["summary_by"] is None and first["replaced"] and first["dropped"] == []
    new = ep.trajectories[1]
    assert ctx.marker in spans(new, Source.PROMPT) + spans(new, Source.TEMPLATE)
    assert "page 1 says" not in spans(new)
    assert ep.receipt.ledger["used"]["compactions"] == len(ep.receipt.compactions)


def test_after_max_compactions_a_full_context_stops_the_episode(tiny):
    ctx = ContextConfig(policy="drop_observations", max_compactions=1, keep_turns=2)
    ep = run(tiny, ctx, script=reader(tiny, answer_at=40), steps=40, tool_calls=40)
    assert len(ep.receipt.compactions) == 1
    assert ep.stop_reason is StopReason.CONTEXT_OVERFLOW


@pytest.mark.parametrize("by", ["function", "endpoint"])
def test_a_summarizer_must_be_configured_fully(by):
    with pytest.raises(ValueError, match=f"summarizer.by={by} needs"):
        SummarizerConfig(by=by)


def test_a_context_too_small_for_the_reserve_is_refused_at_config_time():
    with pytest.raises(ValueError, match=r"leave no room in budgets\.context_tokens=400"):
        RolloutConfig(budgets=Budgets(context_tokens=400), context=ContextConfig(policy="compact"))
    RolloutConfig(budgets=Budgets(context_tokens=400), context=ContextConfig())  # stop: fine


def test_the_viewer_and_show_say_where_each_sample_starts_and_why(tiny):
    from tracerl.report.run import sample_origin
    from tracerl.report.viewer import _token_view

    ep = run(tiny, ContextConfig(policy="compact", summarizer=SummarizerConfig(instruction=ASK)))
    first = ep.receipt.compactions[0]
    assert sample_origin(ep.trajectories, 0) == "the episode: first sample"
    why = sample_origin(ep.trajectories, 1)
    assert why == (
        f"the episode: compact after step {first['step']}, summary by policy, "
        f"{first['tokens_before']} -> {first['tokens_after']} tokens"
    )
    assert "summary by policy" in _token_view(ep.trajectories[1], why)
    dropped = run(tiny, ContextConfig(policy="drop_observations"))
    assert "drop_observations after step" in sample_origin(dropped.trajectories, 1)


def test_the_terminal_reserve_survives_a_compaction(tiny):
    # routed to finalize in the observation that also compacts (keep_turns 0: no turn kept)
    from tracerl.rollout.budget import TerminalReserve

    reserve = TerminalReserve(min_steps_for_finalize=2)

    def agent(request):
        tail = tiny.renderer.decode(request.prompt_ids[-80:])
        return ANSWER if "Budget nearly spent" in tail else reader(tiny)(request)

    sampler = ScriptedSampler.from_texts(tiny.renderer, agent)
    cfg = RolloutConfig(
        budgets=Budgets(steps=3, context_tokens=CONTEXT, tool_calls=12),
        max_turn_tokens=40,
        observation_max_tokens=64,
        reserve=reserve,
        context=ContextConfig(
            policy="compact",
            keep_turns=0,
            reserve_tokens=CONTEXT - 200,  # compact at the first observation
            summarizer=SummarizerConfig(
                by="function", fn="tests.unit.test_context:summarize_pages"
            ),
        ),
    )
    policy = Policy(sampler, tiny.renderer, P, "tiny-random")
    task = {"id": "t", "prompt": "Read every page, then answer."}
    ep = asyncio.run(run_episode(Pages(), task, policy, cfg, seed=3))
    assert ep.receipt.compactions and ep.receipt.ledger["finalize"] == "reserve_reached"
    new = ep.trajectories[1]
    first_policy = next(i for i, m in enumerate(new.loss_mask) if m)
    assert reserve.instruction in tiny.renderer.decode(new.token_ids[:first_policy])
    assert ep.stop_reason is StopReason.ANSWERED


def test_policy_summaries_happen_in_time_where_the_template_drops_earlier_reasoning(
    family_renderer,
):
    # Qwen3 stops printing a turn's <think> once a user turn follows: the summarize
    # instruction starts a new sample itself, and the look-ahead must measure that one
    r = family_renderer("qwen3")
    hermes = get_parser("hermes")

    def turn(request):
        if ASK in r.decode(request.prompt_ids[-60:]):
            return SUMMARY
        if request.turn >= 8:
            return ANSWER
        call = hermes.format_calls([("read", {"page": request.turn + 1})])
        return f"<think>\nPage {request.turn + 1} is next.\n</think>\n\n{call}"

    policy = Policy(ScriptedSampler.from_texts(r, turn), r, hermes, "qwen3")
    cfg = RolloutConfig(
        budgets=Budgets(steps=12, context_tokens=CONTEXT, tool_calls=12),
        max_turn_tokens=64,
        observation_max_tokens=64,
        reserve=None,
        context=ContextConfig(policy="compact", summarizer=SummarizerConfig(instruction=ASK)),
    )
    task = {"id": "t", "prompt": "Read every page, then answer."}
    ep = asyncio.run(run_episode(Pages(), task, policy, cfg, seed=3))
    assert ep.receipt.compactions and ep.stop_reason is StopReason.ANSWERED, ep.steps[-1]
    assert all(len(t) <= CONTEXT for t in ep.trajectories)


def test_a_summary_may_be_longer_than_a_turn(tiny):
    # summarizer.max_tokens, not max_turn_tokens, bounds the summarize turn
    long = "SUMMARY: " + " ".join(f"page {i} gives {i}." for i in range(1, 13))
    n = len(tiny.renderer.encode(long, content=True))

    def script(request):
        return (
            long if ASK in tiny.renderer.decode(request.prompt_ids[-60:]) else reader(tiny)(request)
        )

    ctx = ContextConfig(
        policy="compact", summarizer=SummarizerConfig(instruction=ASK, max_tokens=n + 4)
    )
    ep = run(tiny, ctx, script=script)
    assert n > 40 and ep.receipt.compactions[0]["summary"] == long  # max_turn_tokens is 40


@pytest.mark.parametrize("context", range(200, 700, 50))
def test_dropping_observations_never_hides_the_output_just_asked_for(tiny, context):
    """Under ``drop_observations`` a new sample keeps the last turn whatever ``keep_turns``
    says: the tool output the policy just asked for is never swapped for the marker before
    it has read it. Where even that does not leave room for the next turn, the episode ends
    ``context_overflow`` (as under ``stop``) instead of starting a sample over the context."""
    ctx = ContextConfig(policy="drop_observations", keep_turns=1)
    ep = run(tiny, ctx, context_tokens=context)
    for record in ep.receipt.compactions:
        newest = max([*record["kept"], *record["replaced"], *record["dropped"]])
        assert newest not in record["replaced"], (context, record)
    for t in ep.trajectories:  # every sample the policy sampled in fits its context
        sampled_in = max((i for i, m in enumerate(t.loss_mask) if m), default=0)
        assert sampled_in < context, (context, sampled_in)
    assert ep.stop_reason in (StopReason.ANSWERED, StopReason.CONTEXT_OVERFLOW), ep.stop_reason
