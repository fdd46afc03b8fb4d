"""The progress bars a command draws: a phase whose episodes all finish at its end still
shows what it has sampled so far (model turns and tokens), counted from the phase's start."""

from __future__ import annotations

import asyncio
import io

from rich.console import Console

from tracerl.envs import get_parser, make
from tracerl.report.progress import RichProgress
from tracerl.rollout import ScriptedSampler
from tracerl.rollout.activity import ACTIVITY
from tracerl.rollout.budget import Budgets, RolloutConfig
from tracerl.rollout.groups import run_group
from tracerl.rollout.runner import Policy

CFG = RolloutConfig(budgets=Budgets(steps=2), max_turn_tokens=8, reserve=None)


def _console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=160, force_terminal=True, color_system=None), out


def test_a_phase_shows_the_turns_and_tokens_sampled_since_it_began(tiny):
    sampler = ScriptedSampler.from_texts(tiny.renderer, lambda r: "thinking it over")
    policy = Policy(sampler, tiny.renderer, get_parser("json_list"), "t")
    task = make("refund_desk").sample_tasks(1)[0]
    console, out = _console()
    with RichProgress(console, sampled=ACTIVITY.totals) as bars:
        assert bars.sampled_text() == ""
        bars.phase("eval episodes", 3)
        episodes = asyncio.run(
            run_group(
                lambda: make("refund_desk"),
                task,
                policy,
                CFG,
                group_size=3,
                on_episode=bars.advance,
            )
        )
        turns = sampler.calls
        tokens = sum(sum(t.loss_mask) for e in episodes for t in e.trajectories)
        assert turns >= 3 and bars.sampled_text() == f"{turns} turns {tokens} tok"
        console_text = out.getvalue()
        bars.phase("update micro-batches", 4)  # a phase that samples nothing shows nothing
        assert bars.sampled_text() == ""
    assert "eval episodes" in console_text


def test_large_counts_are_shown_in_thousands():
    counts = [(0, 0)]
    console, out = _console()
    with RichProgress(console, sampled=lambda: counts[0]) as bars:
        bars.phase("step 1 rollouts", 48)
        counts[0] = (1234, 56_789)
        assert bars.sampled_text() == "1234 turns 56.8k tok"
        bars.advance()
    assert "56.8k tok" in out.getvalue()  # drawn on the bar itself
