"""One gateway session: an agent harness's chat requests turned into a provenance-tagged
episode, token by token.

A session is one episode. Its first request's messages (and tools) are rendered by the
model's chat template as the prompt (`tracerl.models.Conversation`). Each answer is sampled
from the run's sampler and appended verbatim as policy tokens, with its log-probs. A later
request *extends* the session when its messages start with exactly the session's history
(`tracerl.gateway.history`); the new messages after that are an observation, rendered as the
template's delta (tool results are `environment`, repeats of the model's call `echo`,
scaffold `template`), exactly as tracerl's own episode runner appends them.

A request that does not extend the history is a *rewrite*. The gateway does not guess what
the harness meant: it closes the current sample, records the break (``history_break`` in
the sample's last step, with what differed) and starts a new sample of the same episode
whose prompt is the request as it now stands. Earlier model turns in that prompt are prompt
tokens; no token is ever a policy token unless it was sampled, in that sample, by the
sampler.

Budgets are the run's (`RolloutConfig.budgets`): `steps` caps the requests answered (model
turns), `sampled_tokens` and `context_tokens` cap tokens as for native episodes. A request
past a budget is refused (HTTP 400, ``budget_exhausted``) and the episode stops for that
budget. Sampling parameters are the run's: a request's temperature, top_p, stop or seed
are recorded and not applied (the learner computes log-probs at the run's temperature).

The request's wire format is read in `tracerl.gateway.chat`; the finished session's receipt
is written by `tracerl.gateway.recording`.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Sequence
from typing import Any

from tracerl.envs.base import Env
from tracerl.envs.parsers import Action
from tracerl.gateway.calls import call_record, check_calls
from tracerl.gateway.chat import (
    GatewayError,
    asked_fields,
    asked_max_tokens,
    completion_body,
    ignored_fields,
    openai_tool_calls,
    read_request,
)
from tracerl.gateway.harness import HarnessEnv
from tracerl.gateway.history import (
    compaction,
    for_template,
    message_key,
    named_tool_results,
    rewrite_reason,
)
from tracerl.gateway.recording import finish_session, session_summary
from tracerl.gateway.tree import SessionTree
from tracerl.rollout import activity
from tracerl.rollout.budget import Ledger, RolloutConfig
from tracerl.rollout.episode import Episode, Policy
from tracerl.rollout.sampler import SampleResult, SamplerUnavailable
from tracerl.rollout.turns import budget_stop, turn_request
from tracerl.types import StopReason, ToolCall, TrajectoryError

log = logging.getLogger("tracerl")


def served_model(policy: Policy) -> str:
    """The name the gateway serves `policy` under (``/v1/models``, each answer's ``model``):
    its sampler's model *name* when the sampler is a client of a server that has one (a
    remote OpenAI-compatible server's model; the vLLM engine's served name, or after a LoRA
    update the adapter's, ``NAME-TAG@v4``, as OpenAI answers with a dated snapshot of the
    model asked for), else the policy's spec (`Policy.model_id`). An in-process sampler's
    ``model`` is the network itself, never a name."""
    name = getattr(policy.sampler, "model", None)
    return name if isinstance(name, str) and name else str(policy.model_id)


def new_token() -> str:
    """A session key: what a harness passes as its API key (unguessable, so one episode's
    harness cannot write into another's session)."""
    return "trs-" + secrets.token_hex(12)


class GatewaySession:
    """One episode's requests, conversation, step records and budget ledger.

    Attributes mirror the episode runner's per-episode state (`env`, `task`, `policy`,
    `cfg`, `ledger`, `records`, `conv`, fault flags), so the finished session becomes an
    `Episode` through the same `finish_episode`.
    """

    def __init__(
        self,
        token: str,
        policy: Policy,
        config: RolloutConfig,
        *,
        seed: int,
        episode_id: str,
        task: dict[str, Any] | None = None,
        env: Env | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.token = token
        self.template_kwargs = template_kwargs  # None: the conversation's own (today's date)
        self.policy, self.cfg, self.seed = policy, config, seed
        self.episode_id = episode_id
        self.task = task if task is not None else {"id": episode_id}
        self.env = env if env is not None else HarnessEnv()
        self.loop = loop
        self.replay_id = "ro_" + secrets.token_hex(5)
        self.t0 = time.perf_counter()
        self.started_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.ledger = Ledger(self.replay_id, str(self.task.get("id")), config.budgets, None)
        self.records: dict[int, dict[str, Any]] = {}
        self.reset_messages: list[dict[str, Any]] = []
        self.conv: Any = None
        self.history: list[dict[str, Any]] = []  # the messages the current sample stands for
        self.tools: list[dict[str, Any]] | None = None
        self.first_tools: list[dict[str, Any]] | None = None
        self.awaiting_observation = False  # the last request was answered
        self.answered_at = 0.0
        self.requests = 0
        self.breaks: list[dict[str, Any]] = []
        self.ignored: set[str] = set()
        self.unanswered: dict[str, Any] | None = None  # the last request, if it got no answer
        self.stop: StopReason | None = None  # a budget that ended the episode
        self.closed = False
        self.error: str | None = None
        self.env_fault = self.unknown_fault = self.eval_fault = False
        self._sampled: dict[str, str] = {}  # an answer (normalized) -> the text sampled
        self.protocols: set[str] = set()  # the wire protocols the harness spoke
        # sub-agents' conversations of this episode (`tracerl.gateway.tree`): a child
        # session has its root as `root_session`, its name as `agent`, and the receipt's
        # link to the root as `parent`
        self.root_session: GatewaySession | None = None
        self.parent: dict[str, Any] | None = None
        self.agent = ""
        self.opened_at = 0
        self.delegation = SessionTree(self)
        # OpenAI Responses: each stored response's conversation (`previous_response_id`)
        self.stored_responses: dict[str, list[dict[str, Any]]] = {}
        self._lock = asyncio.Lock()

    @property
    def answering(self) -> bool:
        """A request of this session is being answered now (requests take turns)."""
        return self._lock.locked()

    # ---- a request -------------------------------------------------------------------------
    async def complete(
        self,
        body: dict[str, Any],
        *,
        protocol: str = "openai-chat",
        ignored: set[str] | frozenset[str] = frozenset(),
    ) -> dict[str, Any]:
        """Answer one chat-completions request (one at a time per session); another
        protocol's request arrives translated (`tracerl.gateway.protocols`), naming itself
        and the fields it ignored. A failure of the gateway itself (not the request's) is
        recorded: the episode is then nobody's signal (``unknown``), never the harness's or
        the model's."""
        async with self._lock:
            try:
                return await self._complete(body, protocol, ignored)
            except GatewayError as e:
                if self.unanswered is not None and "why" not in self.unanswered:
                    self.unanswered["why"] = e.code
                raise
            except Exception as e:
                self.unknown_fault = True
                self.error = self.error or f"gateway failed: {type(e).__name__}: {e}"
                log.warning("gateway session %s: %s", self.episode_id, self.error)
                if self.unanswered is not None:
                    self.unanswered["why"] = "gateway_failed"
                raise GatewayError(500, self.error, "gateway_failed") from e

    async def _complete(
        self, body: dict[str, Any], protocol: str, ignored: set[str] | frozenset[str]
    ) -> dict[str, Any]:
        self._check_open()
        # a request refused for its form (HTTP 400) is no part of the episode: checked whole
        # before anything of it is recorded or counted (exact replay never sees it)
        messages, tools = read_request(body)
        asked_max_tokens(body)
        request = self._update(messages, tools)
        self.requests += 1
        self.protocols.add(protocol)
        self.ignored |= ignored | ignored_fields(body)
        request.update(asked_fields(body))
        if self.cfg.budgets.sampled_tokens is not None:  # the tree's tokens: what replay needs
            others = self.delegation.others_spent(self)
            if others:
                request["tree_sampled_tokens"] = others
        self.unanswered = request  # until it is answered
        stop = self._stop_before_turn()
        if stop is not None:
            self.stop = stop
            raise GatewayError(400, self._budget_message(stop), "budget_exhausted")
        t0 = time.perf_counter()
        res = await self._sample(body)
        self._check_open()  # the episode may have ended while the turn was sampled
        answer = self._answer(res, body, request, time.perf_counter() - t0)
        self.unanswered = None
        return answer

    def _check_open(self) -> None:
        if self.closed:
            raise GatewayError(
                409, f"session {self.episode_id} has ended; it takes no more requests", "closed"
            )
        if self.stop is not None:
            raise GatewayError(400, self._budget_message(self.stop), "budget_exhausted")

    def _budget_message(self, stop: StopReason) -> str:
        return (
            f"this episode stopped ({stop.value}): its budget is spent "
            f"({self.ledger.used['steps']} model turns, {self.ledger.used['sampled_tokens']} "
            "tokens sampled); return your answer"
        )

    # ---- history: extend, or break ---------------------------------------------------------
    def _update(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> dict[str, Any]:
        """Bring the conversation to `messages`; returns what the step records of it."""
        if self.conv is None:
            try:
                self.conv = self.policy.renderer.start(
                    self._for_template(messages),
                    tools,
                    episode_id=self.episode_id,
                    template_kwargs=self.template_kwargs,
                )
            except TrajectoryError as e:
                raise GatewayError(400, f"the messages cannot be rendered: {e}") from None
            self.reset_messages, self.first_tools = messages, tools
            self.history, self.tools = messages, tools
            return {"messages": messages}
        reason = rewrite_reason(
            self.history, self.tools, self.awaiting_observation, messages, tools
        )
        if reason is not None:
            return self._break(messages, tools, reason)
        new = messages[len(self.history) :]
        if self.awaiting_observation:
            self._observe(new)
        self.history = messages
        return {"new_messages": new}

    def _break(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, reason: str
    ) -> dict[str, Any]:
        at = self.conv.step
        try:
            self.conv.restart(self._for_template(messages), tools, reason=reason)
        except TrajectoryError as e:
            raise GatewayError(400, f"the messages cannot be rendered: {e}") from None
        compacted = compaction(self.history, messages)
        kind = "compaction" if compacted else "rewrite"
        self.breaks.append(
            {
                "step": at,
                "reason": reason,
                "kind": kind,
                **({"compaction": compacted} if compacted else {}),
            }
        )
        if not getattr(self.policy.renderer, "warned_history_break", False):
            self.policy.renderer.warned_history_break = True
            log.warning(
                "gateway session %s: the harness rewrote its history (%s); a new sample "
                "starts (reported once)",
                self.episode_id,
                reason,
            )
        self.history, self.tools = messages, tools
        self.awaiting_observation = False
        return {"messages": messages, "tools": tools, "history_break": reason}

    def _observe(self, new: list[dict[str, Any]]) -> None:
        """The harness's answer to the model's last turn: tool results, user turns."""
        step = self.conv.step
        open_calls = dict(self.conv.open_calls)
        filled = named_tool_results(new, open_calls)
        try:
            self.conv.add_observation(filled)
        except TrajectoryError as e:
            raise GatewayError(400, f"the new messages cannot be appended: {e}") from None
        self.awaiting_observation = False
        waited_ms = round((time.perf_counter() - self.answered_at) * 1000, 3)
        rec = self.records[step]
        rec["observation_messages"] = filled
        rec["latency_ms"] = waited_ms
        rec["calls"] = [
            call_record(open_calls[m["tool_call_id"]], m, rec)
            for m in filled
            if m["role"] == "tool" and m["tool_call_id"] in open_calls
        ]
        if self.ledger.events and self.ledger.events[-1]["step"] == step:
            self.ledger.events[-1]["cost_ms"] = round(waited_ms, 1)

    def _for_template(self, messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        return for_template(messages, self._sampled, self.policy.parser)

    # ---- a turn ----------------------------------------------------------------------------
    def _stop_before_turn(self) -> StopReason | None:
        self.ledger.context_tokens = len(self.conv.token_ids)
        elapsed = round(time.perf_counter() - self.t0, 4)
        stop = budget_stop(self.cfg.budgets, self.ledger, elapsed)
        left = self.delegation.tokens_left(self)
        if stop is None and left is not None and left <= 0:  # the tree's tokens are spent
            stop = StopReason.MAX_TOKENS
        if stop is None:
            self.ledger.elapsed_s.append(elapsed)
        return stop

    async def _sample(self, body: dict[str, Any]) -> SampleResult:
        asked = asked_max_tokens(body)
        left = self.delegation.tokens_left(self) if self.root_session is not None else None
        if left is not None:  # a child's turn: what the tree's token budget leaves
            asked = left if asked is None else min(asked, left)
        request = turn_request(
            self.conv, self.cfg, self.ledger, self.seed, self.episode_id, asked=asked
        )
        try:
            return await activity.sample(self.policy.sampler, request)
        except SamplerUnavailable as e:  # the generation server is down: infrastructure
            self.env_fault, self.error = True, f"sampler unavailable: {e}"
            raise GatewayError(503, f"the model is unavailable: {e}", "sampler_unavailable") from e
        except Exception as e:
            self.unknown_fault, self.error = True, f"sampling failed: {type(e).__name__}: {e}"
            log.warning("gateway session %s: %s", self.episode_id, self.error)
            raise GatewayError(500, self.error, "sampling_failed") from e

    def _answer(
        self, res: SampleResult, body: dict[str, Any], request: dict[str, Any], sample_s: float
    ) -> dict[str, Any]:
        renderer, parser = self.policy.renderer, self.policy.parser
        step = self.conv.step
        ids = res.token_ids
        stopped = res.finish_reason == "stop" and ids and ids[-1] in renderer.stop_token_ids
        text = renderer.decode(ids[:-1] if stopped else ids)
        if self.tools is None or body.get("tool_choice") == "none":
            # no tools offered, or none wanted: whatever the model wrote is text, as a chat
            # model's answer (a tag protocol such as Search-R1's is the harness's to read)
            action = Action(text=text, answer=text)
        else:
            action = parser.parse(text, step=step)
        calls: tuple[ToolCall, ...] = () if action.error else action.tool_calls
        wrong = check_calls(calls, self.tools)
        fault = action.error or (wrong[0] if wrong else None)
        self.conv.add_policy(
            ids,
            res.logprobs,
            finish_reason=res.finish_reason,
            tool_calls=calls,
            policy_version=res.policy_version,
        )
        self.ledger.used["steps"] += 1
        self.ledger.used["sampled_tokens"] += len(ids)
        self.ledger.used["tool_calls"] += len(calls)
        self.delegation.paid(self, len(ids), len(calls))
        content = (parser.strip_calls(text) or None) if calls else text
        message: dict[str, Any] = {"role": "assistant", "content": content}
        normalized: dict[str, Any] = {"role": "assistant", "content": content or ""}
        if calls:
            message["tool_calls"] = openai_tool_calls(calls)
            normalized["tool_calls"] = [
                {"id": c.id, "name": c.name, "arguments": c.arguments} for c in calls
            ]
        self._sampled[message_key(normalized)] = self.conv.messages[-1]["content"]
        self.history = [*self.history, normalized]
        self.awaiting_observation = True
        self.answered_at = time.perf_counter()
        finish = "tool_calls" if calls else ("length" if res.finish_reason == "length" else "stop")
        rec = self.records.setdefault(step, {"elapsed_s": self.ledger.elapsed_s[-1]})
        rec.update(
            action=action.to_dict(),
            policy_error=fault is not None,
            infra_error=False,
            attempts=[],
            request=request,
            response={
                "content": content,
                "tool_calls": normalized.get("tool_calls", []),
                "finish_reason": finish,
            },
            sample_ms=round(sample_s * 1000, 3),
            reward={"task": None, "attribution": "policy" if fault else None},
        )
        if fault is not None:
            rec["fault"] = fault.to_dict()
        if wrong is not None:
            rec["fault_call"] = wrong[1]
        label = "parse_error" if action.error else "+".join(c.name for c in calls) or "answer"
        self.ledger.record(step, label, 0.0, len(ids), None)
        prompt_n = len(self.conv.token_ids) - len(ids)
        usage = {
            "prompt_tokens": prompt_n,
            "completion_tokens": len(ids),
            "total_tokens": prompt_n + len(ids),
        }
        extra = {"policy_version": res.policy_version, "tracerl": {"step": step}}
        return completion_body(
            f"chatcmpl-{self.replay_id}-{step}",
            served_model(self.policy),
            message,
            finish,
            usage,
            extra,
        )

    def note_failure(self, error: str) -> None:
        """Infrastructure failed a request outside the session (no answer in time): the
        episode is the environment's, whatever the harness does next."""
        self.env_fault = True
        self.error = self.error or error

    # ---- the end ---------------------------------------------------------------------------
    def finish(
        self, stop: StopReason, *, answer: Any = None, agent: dict[str, Any] | None = None
    ) -> Episode:
        """Close the session: the episode it recorded, ended by `stop` (whose it is follows
        from the fault flags, as for the runner's episodes). `answer` goes into the last
        step's ``info`` (what rewards read); `agent` into the receipt."""
        return finish_session(self, stop, answer, agent)

    # ---- inspection --------------------------------------------------------------------------
    def summary(self, *, tokens: bool = False) -> dict[str, Any]:
        """What the session holds; `tokens`: every sample token by token (ids, sources,
        log-probs, text) in place of their count."""
        return session_summary(self, tokens=tokens)
