"""The episode runner: one agent, one environment, one task, until a stop reason.

Read top to bottom, an episode is::

    reset the env  ->  render the prompt  ->  loop:
        check budgets (steps, tokens, context, wall time)      -> maybe stop
        sample one model turn (policy tokens, loss 1)           -> parse it into an Action
        parse error?   show it to the model (policy's fault)    -> maybe parse_error_limit
        final answer?  let the env see it                       -> stop: answered
        tool calls?    gate them on the budget and the reserve,
                       run them (retrying infra faults with backoff),
                       truncate huge outputs, update the ledger,
                       maybe route to finalize                  -> append the observation

Every step is recorded with what the design notes ask for (``action``, ``observation``,
``env_status``, ``policy_error``, ``infra_error``, ``reward.attribution``) plus the raw
environment results of every attempt, which is what exact replay feeds back in.
An episode whose environment failed it is kept, attributed to the environment and marked
ineligible for the policy gradient; it never becomes a negative sample.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from tracerl.envs.base import CallOutcome, Env, Message, StepResult, release_toolboxes
from tracerl.envs.parsers import Action
from tracerl.envs.tools import ToolResult
from tracerl.rollout import activity
from tracerl.rollout.budget import Ledger, RolloutConfig
from tracerl.rollout.context import EpisodeContext, Summarize
from tracerl.rollout.context.subagents import Delegation
from tracerl.rollout.episode import Episode, Policy, episode_seed, finish_episode
from tracerl.rollout.sampler import SampleResult, SamplerUnavailable
from tracerl.rollout.steps import gave_up, observation, step_with_retries
from tracerl.rollout.turns import budget_stop, context_room, turn_request
from tracerl.types import Attribution, Fault, FaultKind, StopReason

log = logging.getLogger("tracerl")
Sleep = Callable[[float], Awaitable[None]]
__all__ = ["Episode", "Policy", "episode_seed", "failed_episode", "run_episode"]


async def run_episode(
    env: Env,
    task: dict[str, Any],
    policy: Policy,
    config: RolloutConfig | None = None,
    *,
    seed: int = 0,
    episode_id: str | None = None,
    clock: Callable[[int], float] | None = None,
    sleep: Sleep = asyncio.sleep,
    template_kwargs: dict[str, Any] | None = None,
    summarize: Summarize | None = None,
    agent: str = "",
    depth: int = 0,
    parent: dict[str, Any] | None = None,
    children_replay: dict[str, dict[str, Any]] | None = None,
) -> Episode:
    """Run one episode to its stop reason. The env is closed afterwards.

    `clock(step)` returns the seconds elapsed before model turn `step`, `template_kwargs`
    the chat template's per-conversation values, and `summarize` writes compactions'
    summaries (``rollout.context``); replay passes the recorded ones. By default: the wall
    clock since the episode started, today's date, the configured summarizer. `agent`,
    `depth` and `parent` are a sub-agent's (`tracerl.rollout.context.subagents`);
    `children_replay` holds each sub-agent's recorded clock and summaries (replay).
    """
    cfg = config or RolloutConfig()
    prepared = await _prepare(env)
    run = _EpisodeRun(env, task, policy, cfg, seed, episode_id, clock, sleep, template_kwargs)
    run.context = EpisodeContext(cfg, summarize)
    run.delegation = Delegation(cfg, depth)
    run.agent, run.parent, run.children_replay = agent, parent, children_replay
    if agent:  # a sub-agent's episode id is its root's, then its path
        run.root_episode_id = run.episode_id[: -len(agent) - 1]
    if isinstance(failed := prepared, Exception):  # set-up before the episode's clock
        run.prepare_error = f"prepare failed: {type(failed).__name__}: {failed}"
    try:
        return await run.run()
    finally:
        if (ended := getattr(policy.sampler, "end_episode", None)) is not None:
            ended(run.episode_id)  # a sampler keeping its turns' keys and values drops them
        try:
            await env.close()
        except Exception as e:  # a finished episode is kept even if cleanup fails
            log.warning("%s: env.close() failed: %s: %s", run.episode_id, type(e).__name__, e)
        finally:
            await release_toolboxes(env)  # its MCP servers end, whatever close() did


async def _prepare(env: Env) -> Exception | None:
    """Run `env.prepare()` on a thread (it may build an index or start a service), or skip
    it where the env keeps the base class's no-op: a thread hop per episode is ~0.1-1 ms
    of waiting on the GIL, which a run of short episodes feels. Its error, or None."""
    if type(env).prepare is Env.prepare:
        return None
    try:
        await asyncio.to_thread(env.prepare)
    except Exception as e:
        return e
    return None


async def failed_episode(
    env: Env,
    task: dict[str, Any],
    policy: Policy,
    config: RolloutConfig | None,
    *,
    seed: int,
    episode_id: str,
    error: str,
) -> Episode:
    """An episode the infrastructure never let run (the workers it was sent to died):
    ``infra_failure`` with `error`, the environment's, never trained on."""
    cfg = config or RolloutConfig()
    run = _EpisodeRun(env, task, policy, cfg, seed, episode_id, None, asyncio.sleep, None)
    run.env_fault, run.error = True, error
    await env.close()
    return finish_episode(run, StopReason.INFRA_FAILURE)


class _EpisodeRun:
    def __init__(
        self,
        env: Env,
        task: dict[str, Any],
        policy: Policy,
        config: RolloutConfig,
        seed: int,
        episode_id: str | None,
        clock: Callable[[int], float] | None,
        sleep: Sleep,
        template_kwargs: dict[str, Any] | None,
    ) -> None:
        self.env, self.task, self.policy, self.cfg, self.seed = env, task, policy, config, seed
        self.episode_id = episode_id or f"{task.get('id', 'task')}:s{seed}"
        self.replay_id = (
            "ro_" + hashlib.sha256(f"{self.episode_id}:{time.time_ns()}".encode()).hexdigest()[:10]
        )
        self.t0 = time.perf_counter()
        self.clock = clock or (lambda step: time.perf_counter() - self.t0)
        self.sleep = sleep
        self.ledger = Ledger(self.replay_id, str(task.get("id")), config.budgets, config.reserve)
        self.records: dict[int, dict[str, Any]] = {}
        self.reset_messages: list[Message] = []
        self.conv: Any = None
        self.parse_errors = 0
        self.env_fault = False  # the policy saw a degraded observation, or the env failed it
        self.unknown_fault = False
        self.write_task = task.get("effect") == "write"
        self.announced = False  # the finalize instruction was shown
        self.error: str | None = None  # what crashed the episode, if anything
        self.started_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.eval_fault = False
        self.final_state: dict[str, Any] | None = None
        self.prepare_error: str | None = None
        self.template_kwargs = template_kwargs  # None: the conversation picks (today's date)
        self.context = EpisodeContext(config)
        self.delegation = Delegation(config)
        self.agent, self.parent = "", None  # a sub-agent's name and its parent's call
        self.children_replay: dict[str, dict[str, Any]] | None = None
        self.cut_stop = StopReason.MAX_TOKENS  # what a turn cut short means (sample_turn)
        self.root_episode_id = self.episode_id

    # ---- the loop --------------------------------------------------------------------------
    async def run(self) -> Episode:
        try:
            stop = await self._loop()
            await self._read_final_state()
        except SamplerUnavailable as e:  # the generation server is down: infrastructure
            self.env_fault, self.error = True, f"sampler unavailable: {e}"
            stop = StopReason.INFRA_FAILURE
        except Exception as e:  # a crash (bad env output, sampler failure, a bug) ends the
            # episode, which is kept with its receipt: nothing is lost, and it is nobody's
            # signal. The unknown rate makes it visible.
            log.warning("episode %s crashed: %s: %s", self.episode_id, type(e).__name__, e)
            self.unknown_fault = True
            self.error = f"{type(e).__name__}: {e}"
            stop = StopReason.INFRA_FAILURE
        return finish_episode(self, stop)

    async def _loop(self) -> StopReason:
        stop = await self._start()
        while stop is None:
            stop = self._stop_before_turn()
            if stop is not None:
                break
            step = self.conv.step
            if self.context.summary_due:  # the context asked for a summary: this turn
                stop = await self.context.write_summary(self, step)
                continue
            res = await self.sample_turn(step)
            action = self.policy.parser.parse(self.text_of(res), step=step)
            self.conv.add_policy(
                res.token_ids,
                res.logprobs,
                finish_reason=res.finish_reason,
                tool_calls=action.tool_calls,
                policy_version=res.policy_version,
            )
            self.ledger.used["steps"] += 1
            self.ledger.used["sampled_tokens"] += len(res.token_ids)
            stop = await self._act(step, action, res)
        return stop

    async def _read_final_state(self) -> None:
        """The world as the episode left it, before the env closes (for the reward); a read
        that fails leaves the reward nothing to decide on: the environment's fault."""
        try:
            self.final_state = await self.env.final_state() if self.conv else None
        except Exception as e:
            self.env_fault, self.error = True, self.error or f"final state: {type(e).__name__}: {e}"

    async def _start(self) -> StopReason | None:
        if self.prepare_error is not None:
            self.env_fault, self.error = True, self.prepare_error
            return StopReason.INFRA_FAILURE
        try:
            self.env.episode_id = self.episode_id  # the env's episode placeholders
            self.reset_messages = await self.env.reset(self.task, self.seed)
        except Exception as e:  # the env failed to start: an infra failure
            self.env_fault = True
            self.error = f"reset failed: {type(e).__name__}: {e}"
            return StopReason.INFRA_FAILURE
        self.conv = self.policy.renderer.start(
            self.reset_messages,
            self.env.tool_schemas() or None,
            episode_id=self.episode_id,
            template_kwargs=self.template_kwargs,
        )
        if self.write_task and not self.ledger.write_reserve_fits():
            return StopReason.WRITE_BLOCKED
        return None

    def _stop_before_turn(self) -> StopReason | None:
        step = self.conv.step
        self.ledger.context_tokens = len(self.conv.token_ids)
        elapsed = round(self.clock(step), 4)  # compared as recorded, so replay agrees
        self.ledger.elapsed_s.append(elapsed)
        stop = budget_stop(self.cfg.budgets, self.ledger, elapsed)
        return self._route_stop(stop) if stop is StopReason.MAX_STEPS else stop

    def _route_stop(self, default: StopReason) -> StopReason:
        """A budget ran out: if the agent had been routed to finalize, that is why it stopped."""
        return StopReason(self.ledger.finalize) if self.ledger.finalize else default

    async def sample_turn(self, step: int, cap: int | None = None) -> SampleResult:
        """The model's next turn (at most `cap` tokens, when given)."""
        request = turn_request(
            self.conv, self.cfg, self.ledger, self.seed, self.episode_id, turn_tokens=cap
        )
        room = context_room(self.cfg, self.ledger)  # a turn the context's end cuts: overflow
        self.cut_stop = (
            StopReason.CONTEXT_OVERFLOW
            if room is not None and room <= request.max_tokens
            else StopReason.MAX_TOKENS
        )
        return await activity.sample(self.policy.sampler, request)

    def text_of(self, res: SampleResult) -> str:
        """A turn's text, less the stop token that ended it."""
        ids = res.token_ids
        if res.finish_reason == "stop" and ids and ids[-1] in self.policy.renderer.stop_token_ids:
            ids = ids[:-1]
        return self.policy.renderer.decode(ids)

    # ---- one step --------------------------------------------------------------------------
    async def _act(self, step: int, action: Action, res: SampleResult) -> StopReason | None:
        rec = self.records.setdefault(step, {"elapsed_s": self.ledger.elapsed_s[-1]})
        rec.update(action=action.to_dict(), policy_error=False, infra_error=False, attempts=[])
        t0 = time.perf_counter()
        if res.finish_reason == "length" and self.cut_stop is StopReason.CONTEXT_OVERFLOW:
            # the context's end cut the turn: whatever it held (an answer, a whole tool call,
            # half of one), the episode ends context_overflow, as when the context is full
            # before a turn. Nothing is parsed or run, and it is no format mistake.
            self._log_step(step, "context_cut", t0, res, rec, None)
            return StopReason.CONTEXT_OVERFLOW
        if action.error is not None:
            return await self._parse_error(step, action.error, rec, res)
        if action.is_final and res.finish_reason == "length":
            self._log_step(step, "answer_cut", t0, res, rec, None)
            return StopReason.MAX_TOKENS  # the answer was cut off by the turn's token cap
        if action.is_final:
            result = await self._env_step(action, rec)
            self._log_step(step, "answer", t0, res, rec, result)
            if result is None:
                return StopReason.INFRA_FAILURE
            rec["info"] = result.info or {"answer": {"text": action.answer, "citations": []}}
            return StopReason.ANSWERED
        return await self._tool_step(step, action, res, rec, t0)

    async def _parse_error(
        self, step: int, fault: Fault, rec: dict[str, Any], res: SampleResult
    ) -> StopReason | None:
        self.parse_errors += 1
        rec.update(policy_error=True, fault=fault.to_dict())
        self._log_step(step, "parse_error", time.perf_counter(), res, rec, None)
        if self.parse_errors >= self.cfg.max_parse_errors:
            return StopReason.PARSE_ERROR_LIMIT
        note = f"Your last message could not be read ({fault.message})."
        return await self._observe(step, [{"role": "user", "content": note}], rec)

    async def _tool_step(
        self, step: int, action: Action, res: SampleResult, rec: dict[str, Any], t0: float
    ) -> StopReason | None:
        allowed, refused, stop = self._gate(action)
        mine, allowed = self.delegation.split(self.env, allowed)
        pending = len(mine) + len(allowed)  # this step's calls, not yet in the ledger
        delegated = [await self.delegation.run(self, step, c, run_episode, pending) for c in mine]
        result = StepResult([])
        if allowed:
            result = await self._env_step(dataclasses.replace(action, tool_calls=allowed), rec)
            if result is None:
                self._log_step(step, "+".join(c.name for c in allowed), t0, res, rec, None)
                return StopReason.INFRA_FAILURE
        done = [*refused, *delegated]  # outcomes the environment never saw
        outcomes = {o.call.id: o for o in result.calls} | {o.call.id: o for o in done}
        messages = self._merge(action, result, done)
        self._account(outcomes.values())
        rec["calls"] = [outcomes[c.id].to_record() for c in action.tool_calls if c.id in outcomes]
        rec["policy_error"] = any(r["policy_error"] for r in rec["calls"])
        rec["infra_error"] = rec["infra_error"] or any(r["infra_error"] for r in rec["calls"])
        rec["unknown_error"] = any(
            (r["result"]["error"] or {}).get("attribution") == "unknown" for r in rec["calls"]
        )
        rec.update(terminated=result.terminated, truncated=result.truncated, info=result.info)
        self._log_step(step, "+".join(c.name for c in action.tool_calls), t0, res, rec, result)
        if stop is not None:
            return stop
        if result.terminated and result.info.get("answer") is not None:
            return StopReason.ANSWERED  # an answer tool (with citations, say) ended it
        if result.terminated or result.truncated:
            return StopReason.ENV_TERMINATED
        stop = self.ledger.after_tool_step(self.cfg, self.write_task)
        if stop is not None:
            return stop
        if self.ledger.finalize and not self.announced and self.cfg.reserve is not None:
            # Routed to finalize: the instruction is an environment turn (no loss).
            self.announced = True
            rec["finalize"] = self.ledger.finalize
            messages.append({"role": "user", "content": self.cfg.reserve.instruction})
        return await self._observe(step, messages, rec)

    def _gate(self, action: Action) -> tuple[list[Any], list[CallOutcome], StopReason | None]:
        """Which calls run. Refusals are the policy's faults, shown to it as tool results."""
        writes = {t.name for t in self.env.tools if t.effect == "write"}
        allowed, reasons, stop = self.ledger.gate(action.tool_calls, writes, self.write_task)
        refused = [
            CallOutcome(
                c,
                ToolResult.failure(Fault(FaultKind.FORBIDDEN_TOOL, f"{c.name}: {reasons[c.id]}")),
                effect="refused",
            )
            for c in action.tool_calls
            if c.id in reasons
        ]
        return allowed, refused, None if stop is None else StopReason(stop)

    async def _env_step(self, action: Action, rec: dict[str, Any]) -> StepResult | None:
        """env.step with retries (see `tracerl.rollout.steps`); None if it kept failing."""
        result, raised = await step_with_retries(self.env, action, self.cfg.retry, self.sleep, rec)
        if raised:
            self.unknown_fault = True  # an env bug: nobody can say whose fault
        elif result is None:
            self.env_fault = True
        if result is None:  # the step's calls are its last attempt's; the receipt names why
            self.error = self.error or gave_up(rec)
        return result

    def _merge(
        self, action: Action, result: StepResult, refused: list[CallOutcome]
    ) -> list[Message]:
        """The observation: env messages and refusals in call order, huge outputs cut."""
        return observation(
            action, result, refused, self.policy.renderer, self.cfg.observation_max_tokens
        )

    def _account(self, outcomes: Any) -> None:
        for o in outcomes:
            if o.effect == "refused":
                continue
            self.ledger.used["tool_calls"] += 1
            # A write the tool refused (bad arguments, forbidden) did not happen: it costs a
            # tool call, not the write budget. One that failed in the service may have.
            refused_by_tool = o.fault is not None and o.fault.attribution is Attribution.POLICY
            self.ledger.used["write_actions"] += o.effect == "write" and not refused_by_tool
            if o.fault is not None and o.fault.attribution is Attribution.ENVIRONMENT:
                self.env_fault = True  # a degraded observation reached the policy
            if o.fault is not None and o.fault.attribution is Attribution.UNKNOWN:
                self.unknown_fault = True
            if o.fault is not None and o.fault.attribution is Attribution.EVALUATOR:
                self.eval_fault = True

    async def _observe(
        self, step: int, messages: list[Message], rec: dict[str, Any]
    ) -> StopReason | None:
        """Append the observation, or compact the context first (`tracerl.rollout.context`)."""
        rec["observation_messages"] = messages
        messages = messages or [{"role": "user", "content": "(no output)"}]
        return await self.context.observe(self, step, messages, rec)

    def _log_step(
        self,
        step: int,
        label: str,
        t0: float,
        res: SampleResult,
        rec: dict[str, Any],
        result: StepResult | None,
    ) -> None:
        gain = result.evidence_gain if result is not None else None
        rec["evidence_gain"] = gain or 0.0
        cost_ms = rec.get("latency_ms", (time.perf_counter() - t0) * 1000)
        self.ledger.record(step, label, cost_ms, len(res.token_ids), gain)
        owner = (
            Attribution.ENVIRONMENT
            if rec["infra_error"]
            else Attribution.POLICY
            if rec["policy_error"]
            else None
        )
        rec["reward"] = {"task": None, "attribution": owner.value if owner else None}
