"""Training an agent someone already wrote: ``agent: mypkg.agent:solve`` in a config.

The agent is an async function ``solve(task, client) -> answer`` where `client` is a
standard ``openai.AsyncOpenAI`` (a plain function gets an ``openai.OpenAI``; a ``client``
annotated ``anthropic.AsyncAnthropic`` or ``Anthropic`` gets that client instead); an agent that
makes its own client (LangChain's ``ChatOpenAI``, a framework's settings) takes
``solve(task, base_url, api_key)`` instead. tracerl
calls it once per episode, each call with its own gateway session (the client's API key
names it) and its own thread and event loop, so one harness that blocks cannot stall
another, and the run can always take its episodes back:

    run_group -> AgentBackend.run_episode(task, seed, episode id)
        opens a session (the run's sampler, rollout budgets, the episode's seed)
        runs solve(task, client) in a thread of its own       -> requests to the gateway
        waits at most agent.timeout_s (or budgets.wall_time_s)
        <- the session's episode: trajectories, steps, ledger, receipt (``agent``)

How the episode ends, and whose it is (only the policy's episodes train it):

* the agent returns a value: ``answered`` (the value is the answer the reward reads), or
  ``env_terminated`` when it returns None, or ``max_tokens`` when the model's last turn was
  an answer cut off by the token limit (as for native episodes);
* a budget refused a request (``budgets.steps`` model turns, tokens, context): that budget's
  stop reason, as for native episodes, whatever the agent did next;
* it raised: ``agent_error``, the environment's (the harness and its tools are the
  environment), unless the model's last turn was cut by the token limit or unreadable (a
  parse error, a call to a tool it was not offered, arguments its schema refuses) or the
  exception is one of
  ``agent.policy_exceptions`` (the agent could not use the model's answer): then the
  policy's;
* it returned without ever calling the model: ``agent_error``, the environment's;
* it ran past its time: ``timeout`` (the environment's): its task is cancelled, then an
  exception is raised in its thread; a thread that still does not stop (blocked in C) is
  abandoned, never waited for;
* the sampler failed (a server down): ``infra_failure``, the environment's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections.abc import Callable, Iterator
from typing import Any

from tracerl.envs.base import Env
from tracerl.errors import UserError
from tracerl.gateway.harness import (
    AgentOutcome,
    AgentThread,
    client_sdk,
    import_anthropic,
    import_openai,
    load_agent,
    wants_url,
)
from tracerl.gateway.server import Gateway
from tracerl.gateway.session import GatewaySession, new_token, served_model
from tracerl.imports import load_object
from tracerl.rollout.budget import RolloutConfig
from tracerl.rollout.episode import Episode, Policy
from tracerl.types import StopReason

log = logging.getLogger("tracerl")
GRACE_S = 2.0  # how long a cancelled agent gets to stop, before its thread is interrupted
GATHER_S = 0.005
"""Agents' turns arrive over HTTP from many threads, milliseconds apart: the in-process
batched sampler waits this long for more after each arrival, so they share a batch."""


class AgentBackend:
    """A `RolloutBackend` whose episodes are calls of an agent function through a gateway.

    The environment named in the config supplies the tasks (and the reward); it is built
    per episode only for the receipt, never reset or stepped: the agent and its own tools
    are the environment of these episodes."""

    harness = True
    """Its episodes are the harness's conversations, whatever policy samples: the warm
    start plays the reference agent's turns through it (`tracerl.train.warm_start`)."""

    def __init__(
        self,
        entry: str,
        gateway: Gateway,
        *,
        timeout_s: float = 300.0,
        policy_exceptions: tuple[type[BaseException], ...] = (),
        engine: Any = None,
    ) -> None:
        self.entry = entry
        self.engine = engine  # what samples (`tracerl.engines`): it gets every update
        self.fn = load_agent(entry)
        if not wants_url(self.fn):  # it gets an SDK client (one that makes its own: not)
            import_anthropic() if client_sdk(self.fn) == "anthropic" else import_openai()
        self.gateway = gateway
        self.timeout_s = timeout_s
        self.policy_exceptions = policy_exceptions

    def publish(self, model: Any, version: int) -> None:
        """New weights: the engine the gateway samples from gets them (a vLLM server), or
        already has them (the trainer's own model)."""
        if self.engine is not None:
            self.engine.publish(model, version)

    async def run_episode(
        self,
        env: Callable[[], Env],
        task: dict[str, Any],
        policy: Policy,
        config: RolloutConfig | None,
        *,
        seed: int,
        episode_id: str,
    ) -> Episode:
        cfg = config or RolloutConfig()
        if getattr(policy.sampler, "gather_s", None) == 0.0:  # `BatchedHFSampler`
            policy.sampler.gather_s = GATHER_S
        instance = env()
        # set-up (an index, a worker process) before the episode's clock, as natively
        prepared = await asyncio.gather(asyncio.to_thread(instance.prepare), return_exceptions=True)
        loop = asyncio.get_running_loop()
        session = GatewaySession(
            new_token(),
            policy,
            cfg,
            seed=seed,
            episode_id=episode_id,
            task=task,
            env=instance,
            loop=loop,
        )
        wall = cfg.budgets.wall_time_s
        limit = min(self.timeout_s, wall if wall is not None else math.inf)
        self.gateway.add(session)
        try:
            if isinstance(failed := prepared[0], Exception):
                session.env_fault = True
                session.error = f"prepare failed: {type(failed).__name__}: {failed}"
                return session.finish(StopReason.INFRA_FAILURE, agent={"entry": self.entry})
            outcome = await self._call(session, task, limit)
            return self._finish(session, outcome, limit)
        finally:
            session.closed = True
            self.gateway.remove(session.token)
            try:
                await instance.close()
            except Exception as e:  # a finished episode is kept even if cleanup fails
                log.warning("%s: env.close() failed: %s: %s", episode_id, type(e).__name__, e)

    async def _call(self, session: GatewaySession, task: dict[str, Any], limit: float) -> Any:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[AgentOutcome] = loop.create_future()

        def done(outcome: AgentOutcome) -> None:
            def settle() -> None:
                if not future.done():
                    future.set_result(outcome)

            with contextlib.suppress(RuntimeError):  # the run's loop is gone: nobody waits
                loop.call_soon_threadsafe(settle)

        assert self.gateway.url is not None, "the gateway is not listening"
        thread = AgentThread(self.fn, task, self.gateway.url, session.token, limit, done)
        thread.start()
        try:
            return await asyncio.wait_for(asyncio.shield(future), limit)
        except TimeoutError:
            session.closed = True  # its requests in flight are refused from now on
            await self._stop(thread, future, session.episode_id)
            return AgentOutcome(timed_out=True)
        finally:
            if thread.is_alive() and not future.done():  # the run is being torn down
                session.closed = True
                thread.cancel()

    async def _stop(self, thread: AgentThread, future: asyncio.Future[Any], eid: str) -> None:
        """Cancel, then interrupt, then abandon: never wait on a harness for ever."""
        for action in (thread.cancel, thread.interrupt):
            action()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(future), GRACE_S)
                return
        log.warning(
            "episode %s: the agent's thread did not stop after its timeout (blocked in C "
            "code?); it is abandoned and keeps running in the background",
            eid,
        )

    def _finish(self, session: GatewaySession, outcome: AgentOutcome, limit: float) -> Episode:
        e = outcome.exception
        agent: dict[str, Any] = {
            "entry": self.entry,
            "timeout_s": limit,
            "timed_out": outcome.timed_out,
            "returned": None if outcome.result is None else jsonable(outcome.result),
            "exception": None if e is None else f"{type(e).__name__}: {e}",
            "exception_owner": None,
        }
        if e is not None:
            agent["traceback"] = outcome.traceback
            agent["exception_owner"] = "policy" if self._policys(session, e) else "environment"
        return finish_agent_session(session, agent)

    def _policys(self, session: GatewaySession, e: BaseException) -> bool:
        """Is the agent's crash the model's doing? Its last turn was unreadable or cut by the
        token limit, or the exception is one the config names as the agent failing to use
        the model's answer."""
        if not session.records:  # the model never answered: nothing of it to blame
            return False
        if isinstance(e, self.policy_exceptions):
            return True
        last = session.records.get(max(session.records)) or {}
        # a turn cut by the token limit is the model's, as natively (`max_tokens`): a harness
        # that cannot use it (the Agents SDK raises on an incomplete response) is no outage
        cut = (last.get("response") or {}).get("finish_reason") == "length"
        return bool(last.get("policy_error") or cut)


def finish_agent_session(session: GatewaySession, agent: dict[str, Any]) -> Episode:
    """Close `session` as `agent` (its receipt's account: ``returned``, ``exception``,
    ``exception_owner``, ``timed_out``, ``timeout_s``) says its harness ended it: the stop
    is `ending`'s, the one exact replay decides again, and `agent` is recorded as given."""
    stop = ending(session, agent)
    if stop is StopReason.TIMEOUT and agent.get("timed_out"):
        limit = agent.get("timeout_s")
        session.error = (
            f"the agent did not finish within {limit:g} s ({session.requests} requests)"
            if isinstance(limit, int | float)
            else f"the agent did not finish in time ({session.requests} requests)"
        )
    elif stop is StopReason.AGENT_ERROR:
        session.error = (
            f"the agent raised {agent['exception']}"
            if agent.get("exception") is not None
            else "the agent finished without calling the model"
        )
        session.env_fault = agent.get("exception_owner") != "policy"
    answer = agent.get("returned") if stop is StopReason.ANSWERED else None
    return session.finish(stop, answer=answer, agent=agent)


def ending(session: GatewaySession, agent: dict[str, Any]) -> StopReason:
    """How a gateway episode ended, from its session and what the agent did (`agent`:
    ``timed_out``, ``exception``, ``exception_owner``, ``returned``, as its receipt keeps
    them; exact replay decides again from the replayed session)."""
    if session.env_fault or session.unknown_fault:
        return StopReason.INFRA_FAILURE  # the sampler failed (`session.error` says how)
    if session.stop is not None:
        return session.stop  # a budget refused a request: whatever the agent did next
    if agent.get("timed_out"):
        return StopReason.TIMEOUT
    if agent.get("exception") is not None or session.ledger.used["steps"] == 0:
        return StopReason.AGENT_ERROR  # it raised, or it never called the model
    if agent.get("returned") is None:
        return StopReason.ENV_TERMINATED
    if _cut_answer(session):
        return StopReason.MAX_TOKENS  # as natively: an answer cut off by the token limit
    return StopReason.ANSWERED


def _cut_answer(session: GatewaySession) -> bool:
    """The model's last turn was an answer (no calls) cut off by the token limit."""
    last = session.records[max(session.records)] if session.records else {}
    response = last.get("response") or {}
    return response.get("finish_reason") == "length" and not response.get("tool_calls")


def jsonable(value: Any) -> Any:
    """An agent's return value as the step record keeps it (JSON, or its text)."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return str(value)
    return value


def policy_exception_types(paths: list[str]) -> tuple[type[BaseException], ...]:
    out = []
    for path in paths:
        obj = load_object(path, "agent.policy_exceptions entry")
        if not (isinstance(obj, type) and issubclass(obj, BaseException)):
            raise UserError(
                f"agent.policy_exceptions: {path!r} is not an exception class",
                "list exception classes, e.g. json:JSONDecodeError",
            )
        out.append(obj)
    return tuple(out)


@contextlib.contextmanager
def agent_backend(cfg: Any, policy: Policy, engine: Any = None) -> Iterator[AgentBackend | None]:
    """The run's agent backend and its gateway (``agent`` in the config), or None;
    `engine` (`tracerl.engines`) is what samples, kept in step by `publish`."""
    a = cfg.agent
    if a is None:
        yield None
        return
    with Gateway(served_model(policy), host=a.host, port=a.port, option="agent.port") as gateway:
        yield AgentBackend(
            a.entry,
            gateway,
            timeout_s=a.timeout_s,
            policy_exceptions=policy_exception_types(a.policy_exceptions),
            engine=engine,
        )
