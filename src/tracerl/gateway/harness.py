"""The agent's side of a gateway episode: the user's agent function found and checked, its
call on a thread and event loop of its own with an SDK client pointed at the gateway
(`AgentThread`: the openai SDK's, or the anthropic SDK's when the agent's ``client``
parameter is annotated with an Anthropic client class), and the environment such an episode
has (`HarnessEnv`: the harness and its tools, which tracerl does not run)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import ctypes
import functools
import inspect
import logging
import ssl
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tracerl.envs.base import Env, StepResult
from tracerl.errors import UserError
from tracerl.imports import load_object

log = logging.getLogger("tracerl")

OPENAI_PIP = "pip install 'tracerl[agents]'"
ANTHROPIC_PIP = "pip install anthropic"


class AgentStopped(BaseException):
    """Raised inside an agent's thread that ran past its time (and ignored cancellation)."""


@dataclass
class AgentOutcome:
    """How one agent call ended."""

    result: Any = None
    exception: BaseException | None = None
    traceback: str | None = None
    timed_out: bool = False


def import_openai() -> Any:
    try:
        import openai
    except ImportError:
        raise UserError(
            "agent: the agent's client is the openai SDK, which is not installed",
            f"{OPENAI_PIP} (or pip install openai)",
        ) from None
    return openai


def import_anthropic() -> Any:
    try:
        import anthropic
    except ImportError:
        raise UserError(
            "agent: the agent's client is annotated as the anthropic SDK's, which is not installed",
            ANTHROPIC_PIP,
        ) from None
    return anthropic


def client_sdk(fn: Callable[..., Any]) -> str:
    """Which SDK's client the agent takes: ``anthropic`` when its ``client`` parameter is
    annotated with an Anthropic client class (``client: AsyncAnthropic``), else ``openai``."""
    try:
        param = inspect.signature(fn).parameters.get("client")
    except (TypeError, ValueError):
        return "openai"
    note = getattr(param, "annotation", None) if param is not None else None
    name = note if isinstance(note, str) else getattr(note, "__name__", "")
    return "anthropic" if "Anthropic" in str(name) else "openai"


def load_agent(entry: str) -> Callable[..., Any]:
    """The agent function at ``package.module:function``, checked: callable with a task
    and a client."""
    fn = load_object(entry, "agent")
    if not callable(fn):
        raise UserError(
            f"agent {entry!r} is a {type(fn).__name__}, not a function",
            "point agent at a function solve(task, client) -> answer",
        )
    try:
        if wants_url(fn):
            inspect.signature(fn).bind({}, base_url="", api_key="")
        else:
            inspect.signature(fn).bind({}, object())
    except TypeError:
        raise UserError(
            f"agent {entry!r} cannot be called as {getattr(fn, '__name__', entry)}(task, client)",
            "give it the signature solve(task, client) -> answer (or solve(task, base_url, "
            "api_key) for an agent that makes its own client)",
        ) from None
    except ValueError:  # no signature to inspect (a builtin): try it at run time
        pass
    return fn


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    """One TLS context for every agent's client: building one per client (what the SDK
    does by default) costs ~18 ms, most of an episode's overhead on a tiny model."""
    return ssl.create_default_context()


def wants_url(fn: Callable[..., Any]) -> bool:
    """An agent that makes its own client (LangChain's ``ChatOpenAI``, a framework's
    config) takes ``base_url`` and ``api_key`` instead of a client."""
    try:
        return "base_url" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


class AgentThread(threading.Thread):
    """One agent call on a thread and event loop of its own; `done(outcome)` when it ends."""

    def __init__(
        self,
        fn: Callable[..., Any],
        task: dict[str, Any],
        base_url: str,
        token: str,
        timeout_s: float,
        done: Callable[[AgentOutcome], None],
    ) -> None:
        super().__init__(name=f"tracerl-agent-{token[-6:]}", daemon=True)
        self.fn, self.task, self.base_url, self.token = fn, task, base_url, token
        # the episode's own URL (the session named in it): clients cached per base URL by a
        # framework are never shared between episodes (`tracerl.gateway.server.session_path`)
        self.root = f"{base_url}/s/{token}"
        self.timeout_s, self.done = timeout_s, done
        self.loop: asyncio.AbstractEventLoop | None = None
        self.main: asyncio.Task[Any] | None = None
        self.finished = False

    def run(self) -> None:
        try:
            if inspect.iscoroutinefunction(self.fn):
                result = self._run_async()
            else:
                how = self._connection("OpenAI")
                task = copy.deepcopy(self.task)
                try:
                    result = (
                        self.fn(task, how["client"]) if "client" in how else self.fn(task, **how)
                    )
                finally:
                    if "client" in how:
                        how["client"].close()
                if inspect.isawaitable(result):
                    raise TypeError("the agent returned an awaitable: make it an async def")
            outcome = AgentOutcome(result=result)
        except BaseException as e:  # everything the agent raises is recorded, nothing escapes
            outcome = AgentOutcome(exception=e, traceback=traceback.format_exc(limit=20))
        self.finished = True  # no interrupt from here on: it would land in `done`
        self.done(outcome)

    def _connection(self, kind: str) -> dict[str, Any]:
        """What the agent is called with besides its task: a client, or where to reach
        the gateway (``base_url``, ``api_key``) for an agent that makes its own."""
        if wants_url(self.fn):
            return {"base_url": f"{self.root}/v1", "api_key": self.token}
        return {"client": self._client(kind)}

    def _client(self, kind: str) -> Any:
        anthropic = client_sdk(self.fn) == "anthropic"
        sdk = import_anthropic() if anthropic else import_openai()
        if anthropic:  # its SDK adds /v1 itself
            kind, base_url = kind.replace("OpenAI", "Anthropic"), self.root
        else:
            base_url = f"{self.root}/v1"
        http = getattr(
            sdk,
            "DefaultAsyncHttpxClient" if kind.startswith("Async") else "DefaultHttpxClient",
            None,
        )
        extra = {"http_client": http(verify=_ssl_context())} if http is not None else {}
        return getattr(sdk, kind)(
            base_url=base_url,
            api_key=self.token,
            max_retries=0,  # a failed turn is the gateway's to report, never re-sent blindly
            timeout=self.timeout_s,
            **extra,
        )

    def _run_async(self) -> Any:
        self.loop = loop = asyncio.new_event_loop()
        loop.set_exception_handler(_quiet_foreign_close)

        async def main() -> Any:
            how = self._connection("AsyncOpenAI")
            if "client" not in how:
                return await self.fn(copy.deepcopy(self.task), **how)
            async with how["client"] as client:
                return await self.fn(copy.deepcopy(self.task), client)

        try:
            self.main = loop.create_task(main())
            return loop.run_until_complete(self.main)
        finally:
            with contextlib.suppress(Exception):
                rest = asyncio.all_tasks(loop)
                for t in rest:
                    t.cancel()
                loop.run_until_complete(asyncio.gather(*rest, return_exceptions=True))
            loop.close()

    def cancel(self) -> None:
        """Cancel the agent's task (async agents)."""
        loop, main = self.loop, self.main
        if loop is not None and main is not None:
            with contextlib.suppress(RuntimeError):  # its loop already closed: it ended
                loop.call_soon_threadsafe(main.cancel)

    def interrupt(self) -> None:
        """Raise `AgentStopped` in the thread (it takes effect at its next Python
        bytecode: a thread blocked in C code stays blocked)."""
        if self.ident is not None and self.is_alive() and not self.finished:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(self.ident), ctypes.py_object(AgentStopped)
            )


def _quiet_foreign_close(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The episode loop's handler of errors nobody awaited: an HTTP client of an earlier
    episode, garbage-collected here, closing itself on this loop while its connections
    belong to that episode's closed loop ("Event loop is closed"). LangChain's `ChatOpenAI`
    caches one client per base URL and closes it so (`_AsyncHttpxClientWrapper.__del__`):
    with a base URL per episode, every episode would print that traceback. It is logged at
    debug level; anything else goes to the default handler."""
    error, task = context.get("exception"), context.get("task") or context.get("future")
    coro = getattr(task, "get_coro", lambda: None)()
    closing = getattr(coro, "__qualname__", "").endswith("aclose")
    if isinstance(error, RuntimeError) and "Event loop is closed" in str(error) and closing:
        log.debug("an earlier episode's HTTP client closed on a later loop: %s", error)
        return
    loop.default_exception_handler(context)


class HarnessEnv(Env):
    """The environment of a gateway session: the agent harness and its tools, which
    tracerl does not run. It stands in where an episode needs an env (its receipt)."""

    name = "agent-harness"
    version = "1"
    side_effect_guard = "unmanaged"

    async def reset(self, task: dict[str, Any], seed: int) -> list[dict[str, Any]]:
        raise RuntimeError("an agent harness drives this episode: nothing to reset")

    async def step(self, action: Any) -> StepResult:
        raise RuntimeError("an agent harness drives this episode: nothing to step")

    def sample_tasks(self, n: int, *, seed: int = 0, split: str = "train") -> list[dict[str, Any]]:
        return []
