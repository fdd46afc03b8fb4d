"""One episode's context policy: the episode runner's hooks.

The runner hands every observation to `EpisodeContext.observe` instead of appending it
itself. Under ``stop`` (or with no context budget) it is appended as before. Otherwise the
context looks ahead (`Conversation.length_with`): if the next turn would still fit
(``budgets.context_tokens`` minus `reserve`), the observation is appended; if not:

* ``compact``, policy-written: the observation is appended with the summarize instruction
  (environment tokens), and the next turn is the summarize turn (`summary_due`): the
  runner calls `write_summary`, which samples it (policy tokens, loss 1, within what the
  context and the sampled-token budget leave once a final turn is reserved), then starts a
  new sample (`Conversation.restart`) from the task, the summary and the last turns;
* ``compact`` with a function or an endpoint: it writes the summary from the messages
  (environment-authored: prompt tokens of the new sample, never loss; its failure is the
  environment's) and the new sample starts at once;
* ``drop_observations``: the new sample keeps every message, with the tool outputs older
  than the last `keep_turns` turns replaced by a marker.

Each compaction is a record (the receipt's ``compactions``, the step's ``compaction``):
the step, tokens before and after, who wrote the summary, which of the old sample's
messages were kept, dropped or replaced. The ledger counts them, with the summary tokens
and the summarizer calls. An episode whose context still fills after `max_compactions`, or
where not even a summary fits, stops ``context_overflow`` as under ``stop``.
"""

from __future__ import annotations

import time
from typing import Any

from tracerl.envs.parsers import Action
from tracerl.rollout.context.config import ContextConfig
from tracerl.rollout.context.messages import Message, clean, plain, turns
from tracerl.rollout.context.summarizers import Summarize, SummarizerError, make_summarizer
from tracerl.types import StopReason

_NO_ROOM = {"skipped": "no new sample leaves room for the next turn"}
"""A step's compaction record where none could start (the episode ends context_overflow)."""

MIN_SUMMARY_TOKENS = 8
"""A policy summary with less room than this is not attempted."""


class EpisodeContext:
    def __init__(self, rollout: Any, summarize: Summarize | None = None) -> None:
        """`rollout`: the episode's `RolloutConfig` (its ``context`` section, budgets, turn
        and observation limits); `summarize`: replay's recorded summaries."""
        cfg: ContextConfig = rollout.context
        self.cfg = cfg
        self.limit = rollout.budgets.context_tokens
        self.final_turn = rollout.max_turn_tokens
        self.policy_writes = cfg.policy == "compact" and cfg.summarizer.by == "policy"
        self.summarize = summarize  # else made at the first summary (replay passes its own)
        self.reserve = cfg.reserve_tokens or rollout.max_turn_tokens
        if self.policy_writes and cfg.reserve_tokens is None:
            # the summarize turn comes one step early: after the next turn and its
            # observation (at most observation_max_tokens) it might no longer fit
            self.reserve = rollout.max_turn_tokens + rollout.observation_max_tokens
        self.ask_tokens = 0  # what asking for a summary adds (measured at the first ask)
        self.records: list[dict[str, Any]] = []
        self.due: dict[str, Any] | None = None  # a summarize turn asked for
        self.summarized = False  # the current sample's prompt holds a summary

    @property
    def active(self) -> bool:
        return (
            self.cfg.policy != "stop"
            and self.limit is not None
            and len(self.records) < self.cfg.max_compactions
        )

    @property
    def summary_due(self) -> bool:
        return self.due is not None

    # ---- after a step ----------------------------------------------------------------------
    async def observe(
        self, run: Any, step: int, messages: list[Message], rec: dict[str, Any]
    ) -> StopReason | None:
        """Append `messages` (the step's observation) or compact: see the module's doc."""
        conv = run.conv
        if not self.active:
            conv.add_observation(messages)
            return None
        if self.policy_writes:
            return self._ask_summary(run, step, messages, rec)
        n = conv.length_with(messages)
        if n + self.reserve <= (self.limit or 0):
            conv.add_observation(messages)  # the next turn fits
            return None
        return await self._rewrite(run, step, messages, rec, n)

    def _ask_summary(
        self, run: Any, step: int, messages: list[Message], rec: dict[str, Any]
    ) -> None:
        """The policy writes the summary: asked for now if, after the next turn and its
        observation, there might be no room left to ask (`reserve`)."""
        ask = [*messages, {"role": "user", "content": self.cfg.summarizer.instruction}]
        # (where a template re-renders earlier turns once a user turn arrives, as Qwen3's
        # drops their reasoning, the ask starts a new sample: its length is what counts)
        with_ask = run.conv.length_with(ask)
        limit, cap = self.limit or 0, self.cfg.summarizer.max_tokens
        if with_ask + cap + self.reserve <= limit:
            run.conv.add_observation(messages)  # room enough
            return None
        n = run.conv.length_with(messages)
        self.ask_tokens = max(self.ask_tokens, with_ask - n)
        cap = min(cap, limit - with_ask)
        left = run.ledger.remaining("sampled_tokens")
        if left is not None:
            cap = min(cap, left - self.final_turn)  # a final turn stays affordable
        if cap < MIN_SUMMARY_TOKENS:
            rec["compaction"] = {"skipped": "no room for a summarize turn"}
            run.conv.add_observation(messages)
            return None
        rec["observation_messages"] = ask
        run.conv.add_observation(ask)
        self.due = {"asked_at": step, "tokens_before": n, "cap": cap}
        return None

    async def write_summary(self, run: Any, step: int) -> StopReason | None:
        """The summarize turn: sampled like any turn (policy tokens), then the new sample."""
        due, self.due = self.due, None
        assert due is not None
        t0 = time.perf_counter()
        res = await run.sample_turn(step, cap=due["cap"])
        text = run.text_of(res).strip()
        run.conv.add_policy(
            res.token_ids,
            res.logprobs,
            finish_reason=res.finish_reason,
            policy_version=res.policy_version,
        )
        used = run.ledger.used
        used["sampled_tokens"] += len(res.token_ids)
        used["summary_tokens"] += len(res.token_ids)
        cost_ms = (time.perf_counter() - t0) * 1000
        run.ledger.record(step, "summary", cost_ms, len(res.token_ids), None)
        source = [clean(m) for m in run.conv.messages[:-2]]  # less the ask and the summary
        record = self._restart(run, source, text, "policy", due["tokens_before"], step)
        if record is not None:
            record["summary_tokens"] = len(res.token_ids)
        run.records[step] = {
            "elapsed_s": run.ledger.elapsed_s[-1],
            "action": {**Action(text=text).to_dict(), "kind": "summary"},
            "policy_error": False,
            "infra_error": False,
            "attempts": [],
            "compaction": record or dict(_NO_ROOM),
            "reward": {"task": None, "attribution": None},
        }
        return None if record is not None else StopReason.CONTEXT_OVERFLOW

    async def _rewrite(
        self, run: Any, step: int, messages: list[Message], rec: dict[str, Any], n: int
    ) -> StopReason | None:
        source = [clean(m) for m in run.conv.messages] + [dict(m) for m in messages]
        summary, by = None, None
        if self.cfg.policy == "compact":
            by = self.cfg.summarizer.by
            t0 = time.perf_counter()
            run.ledger.used["summarizer_calls"] += 1
            try:
                self.summarize = self.summarize or make_summarizer(self.cfg.summarizer)
                assert self.summarize is not None
                summary = self._bounded(run, await self.summarize(plain(source)))
            except Exception as e:  # whatever the summarizer did: never the policy's
                run.env_fault = True  # the summarizer is not the policy: never its signal
                why = str(e) if isinstance(e, SummarizerError) else f"{type(e).__name__}: {e}"
                run.error = run.error or f"summarizer failed: {why}"
                rec["compaction"] = {"failed": why, "summary_by": by}
                return StopReason.INFRA_FAILURE
            cost_ms = (time.perf_counter() - t0) * 1000
            run.ledger.record(step, f"summary:{by}", cost_ms, 0, None)
        record = self._restart(run, source, summary, by, n, step)
        if record is None:  # not even the last turn fits a new sample: as under `stop`
            rec["compaction"] = dict(_NO_ROOM)
            run.conv.add_observation(messages)
            return StopReason.CONTEXT_OVERFLOW
        rec["compaction"] = record
        return None

    def _bounded(self, run: Any, text: str) -> str:
        """A summary someone else wrote, cut to ``summarizer.max_tokens`` (what the new
        sample's room was planned for)."""
        renderer, cap = run.policy.renderer, self.cfg.summarizer.max_tokens
        ids = renderer.encode(text, content=True)
        return text if len(ids) <= cap else renderer.decode(ids[:cap]) + " [...]"

    # ---- the new sample --------------------------------------------------------------------
    def _restart(
        self,
        run: Any,
        source: list[Message],
        summary: str | None,
        by: str | None,
        tokens_before: int,
        step: int,
    ) -> dict[str, Any] | None:
        """Start the new sample from `source` (the old sample's messages, cleaned); the
        compaction's record. None, and nothing started, when no new sample leaves room for
        the next turn: the caller stops the episode ``context_overflow``. Without a summary
        (``drop_observations``) the last turn is always kept: the tool output the policy
        just asked for is never replaced by the marker before it has seen it."""
        conv, tools = run.conv, run.env.tool_schemas() or None
        initial = len(run.reset_messages)
        head = initial + (1 if self.summarized else 0)
        most = len(turns(source[head:]))
        floor = 0 if summary is not None else min(1, most)
        chosen = None
        for keep in range(max(min(self.cfg.keep_turns, most), floor), floor - 1, -1):
            messages, kept, replaced = self._prompt(run, source, head, summary, keep)
            length = conv.length_of_restart(messages, tools)
            if length + self._room_after() <= (self.limit or 0):
                chosen = (messages, kept, replaced, length)
                break  # the most turns that leave room for what comes next
        if chosen is None:
            return None
        messages, kept, replaced, length = chosen
        reason = f"compaction {len(self.records) + 1}: {self.cfg.policy}"
        conv.restart(messages, tools, reason=reason)
        self.summarized = summary is not None
        run.ledger.used["compactions"] += 1
        run.ledger.context_tokens = len(conv.token_ids)
        record = {
            "step": step,
            "policy": self.cfg.policy,
            "summary_by": by,
            "summary": summary,
            "tokens_before": tokens_before,
            "tokens_after": len(conv.token_ids),
            "sample": len(conv.samples()) - 1,
            "kept": kept,
            "dropped": [i for i in range(len(source)) if i not in kept and i not in replaced],
            "replaced": replaced,
        }
        self.records.append(record)
        return record

    def _room_after(self) -> int:
        """What a new sample must leave free: the next turn; with policy-written summaries,
        also room to ask for the next summary in time (`reserve` and the summary)."""
        if self.policy_writes:
            return self.reserve + self.ask_tokens + self.cfg.summarizer.max_tokens
        return self.final_turn

    def _prompt(
        self, run: Any, source: list[Message], head: int, summary: str | None, keep: int
    ) -> tuple[list[Message], list[int], list[int]]:
        """The new sample's prompt keeping the last `keep` turns verbatim, the indices of
        `source` kept verbatim, and those whose content was replaced by the marker."""
        initial = len(run.reset_messages)
        body = turns(source[head:])
        recent = {head + i for t in body[len(body) - keep :] for i in t} if keep else set()
        kept = list(range(initial))
        messages = [source[i] for i in range(initial)]
        replaced: list[int] = []
        if summary is not None:
            messages.append({"role": "user", "content": self.cfg.summary_prefix + summary})
            kept += sorted(recent)
            messages += [source[i] for i in sorted(recent)]
        else:  # drop_observations: every message, older tool outputs replaced
            for i in range(initial, len(source)):
                m = source[i]
                if m["role"] == "tool" and i not in recent and m["content"] != self.cfg.marker:
                    messages.append(clean(m, content=self.cfg.marker))
                    replaced.append(i)
                else:
                    messages.append(m)
                    kept.append(i)
        finalize = getattr(run.cfg.reserve, "instruction", None)
        if run.announced and finalize and messages[-1].get("content") != finalize:
            # routed to finalize before the compaction: the new sample is told again
            messages.append({"role": "user", "content": finalize})
        return messages, kept, replaced
