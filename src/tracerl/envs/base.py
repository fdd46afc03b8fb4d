"""The environment contract.

An environment is asynchronous and lives for one episode::

    env = make("refund_desk")
    messages = await env.reset(task, seed)        # the initial messages
    result = await env.step(action)  # StepResult(messages, terminated, truncated, info)
    await env.close()

`terminated` means the task reached an end state (the agent answered, a commit went through);
`truncated` means the environment cut the episode short for its own reasons (Gymnasium's
distinction). Budgets are not the environment's business: the episode runner enforces them.

Every env has a `name` and a `version`, and every tool its own `version`; they go into each
episode's receipt. An env declares the split names `sample_tasks` accepts (`splits`) and may
own its verifier: a `reward(ctx)` method (or `score`), or a layered `reward_components` spec
(`tracerl.rewards`); a run with no reward configured scores episodes with it.

`ToolEnv` is the base for tool-using environments: declare tools as methods with `@tool`,
write `setup` (the initial messages for a task) and `sample_tasks`.

`step` must be safe to retry when it reports a retryable infrastructure fault: such a step has
changed no state (the runner retries it with backoff).
"""

from __future__ import annotations

import logging
import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tracerl.envs.parsers import Action
from tracerl.envs.tools import Tool, ToolResult, ToolSet
from tracerl.types import Attribution, Fault, FaultKind, ToolCall

Message = dict[str, Any]
GUARDS = ("dry_run", "off")


@dataclass
class CallOutcome:
    """One tool call of a step and what came of it (recorded per step, replayed verbatim)."""

    call: ToolCall
    result: ToolResult
    tool_version: str | None = None
    effect: str = "read"

    @property
    def fault(self) -> Fault | None:
        return self.result.error

    def message(self) -> Message:
        """The tool message that shows this outcome to the model."""
        return {
            "role": "tool",
            "tool_call_id": self.call.id,
            "name": self.call.name,
            "content": self.result.content,
        }

    def to_record(self) -> dict[str, Any]:
        """The step record's per-call entry (the design notes' field names)."""
        f = self.fault
        infra = f is not None and f.attribution is Attribution.ENVIRONMENT
        return {
            "call_id": self.call.id,
            "action": {"tool": self.call.name, "args": self.call.arguments},
            "tool_version": self.tool_version,
            "effect": self.effect,
            "observation": {
                # a tool's own error answer (MCP isError) is an observation, not a fault
                "status": f.kind.value if f else "tool_error" if self.result.is_error else "ok",
                "latency_ms": round(self.result.latency_ms, 3),
                "truncated": self.result.truncated,
                "chars": len(self.result.content),
            },
            "env_status": {
                "service": "degraded" if infra else "ok",
                "retryable": bool(f and f.retryable),
            },
            "policy_error": f is not None and f.attribution is Attribution.POLICY,
            "infra_error": infra,
            "result": self.result.to_dict(),
        }

    @classmethod
    def from_record(cls, r: dict[str, Any]) -> CallOutcome:
        call = ToolCall(r["call_id"], r["action"]["tool"], r["action"]["args"])
        return cls(call, ToolResult.from_dict(r["result"]), r.get("tool_version"), r["effect"])


@dataclass
class StepResult:
    """What the environment answered to one action.

    Attributes:
        messages: observation messages (``tool`` results, or a ``user``/``system`` turn).
        terminated: the task reached an end state.
        truncated: the environment cut the episode short.
        info: anything else worth keeping (JSON-able); ``info["answer"]`` for final answers.
        calls: one outcome per executed tool call, in order.
        evidence_gain: the environment's judgement of how much this step moved the agent
            toward an answer (0..1); None when it cannot tell (the ledger records 0).
    """

    messages: list[Message]
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    calls: list[CallOutcome] = field(default_factory=list)
    evidence_gain: float | None = None

    def faults(self) -> list[Fault]:
        return [c.fault for c in self.calls if c.fault is not None]


class Env(ABC):
    """The async, one-instance-per-episode environment contract."""

    name: ClassVar[str] = ""
    version: ClassVar[str] = ""
    tools: ToolSet = ToolSet(())
    side_effect_guard: str = "dry_run"
    allow_real_writes: bool = False
    """Every task may write for real when the guard is off (``env.allow_real_writes``)."""
    episode_id: str | None = None
    """Set by the runner before `reset`: the episode's id (an MCP server's ``${episode_id}``)."""
    splits: tuple[str, ...] | None = None
    """The split names `sample_tasks` accepts, the training split first (an instance may set
    its own: which splits exist can depend on its arguments). None: undeclared; a config's
    splits are then checked by sampling one task of each."""
    reward_components: ClassVar[str | list[dict[str, Any]] | None] = None
    """The env's own layered reward: components as YAML text or a list of dicts
    (`tracerl.rewards.compose`); a component's ``fn`` may name a method of the env."""

    # An env may also define ``reward(self, ctx) -> float | Score | None`` (or ``score``): its
    # verifier, given a `tracerl.rewards.RewardContext` of the finished episode. It is not
    # declared here so that `tracerl.rewards.resolve` can tell whether an env has one.

    @abstractmethod
    async def reset(self, task: dict[str, Any], seed: int) -> list[Message]: ...

    @abstractmethod
    async def step(self, action: Action) -> StepResult: ...

    async def close(self) -> None:  # noqa: B027 - an optional hook, not abstract
        """Release resources (sandboxes, connections). The runner always calls it."""

    def prepare(self) -> None:  # noqa: B027 - an optional hook, not abstract
        """Set-up that belongs before any episode, never inside one's time budget: an index
        built or loaded, a corpus read, a model or service started. The runner calls it
        before each episode's clock starts (on a thread), so it must be cheap once done:
        keep what it builds per process (a module-level cache), not on the instance."""

    async def final_state(self) -> dict[str, Any] | None:
        """The world as the episode left it, read after its last step and before `close`
        (the receipt's ``final_state``, a reward's ``ctx.final_state``). Default: none. It
        must change nothing; raising makes the episode the environment's failure."""
        return None

    def tool_schemas(self) -> list[dict[str, Any]]:
        return self.tools.schemas()

    def tool_versions(self) -> dict[str, str]:
        return self.tools.versions()

    def services(self) -> list[dict[str, Any]]:
        """The outside services the tools reach (MCP servers, as each identified itself:
        name, version, protocol), for receipts. Default: none."""
        return []

    # ---- what `check_env` and the trainers use --------------------------------------------
    @abstractmethod
    def sample_tasks(self, n: int, *, seed: int = 0, split: str = "train") -> list[dict[str, Any]]:
        """`n` tasks (JSON-able dicts with an ``id``), deterministic in `seed`."""

    def check_script(self, task: dict[str, Any]) -> list[Action]:
        """A scripted action sequence for `check_env`: ends the task, uses every write tool."""
        return [Action(text="done", answer="done")]

    def snapshot(self) -> Any:
        """The environment's real (externally visible) state; dry runs must not change it."""
        return None


class ToolEnv(Env):
    """Base for tool-using environments: tools are this class's `@tool` methods.

    Subclasses implement `setup(task, seed)` (initial messages) and `sample_tasks`, and may
    override `finish(action)` (what a final answer does) and `forbidden(call)` (task rules).
    Tools from elsewhere (an MCP server's: `tracerl.envs.mcp.McpTools`) join with `use`;
    they connect at `reset` and disconnect at `close` (an override calls ``super()``'s).
    """

    def __init__(self, *, side_effect_guard: str = "dry_run") -> None:
        side_effect_guard = guard_value(side_effect_guard, f"{type(self).__name__}")
        self.side_effect_guard = side_effect_guard
        cls = type(self)
        names = sorted(n for n in dir(cls) if isinstance(getattr(cls, n, None), Tool))
        self._own_tools = [getattr(self, n) for n in names]
        self.toolboxes: list[Any] = []
        self.tools = ToolSet(self._own_tools, guard=side_effect_guard != "off")
        self.task: dict[str, Any] = {}
        self.rng = random.Random(0)
        self.done = False
        self.answer: dict[str, Any] | None = None  # set by an answer tool: ends the episode

    async def reset(self, task: dict[str, Any], seed: int) -> list[Message]:
        if not isinstance(task, dict) or not task.get("id"):
            raise ValueError(f"{self.name}: a task is a dict with an 'id', got {task!r:.200}")
        self.task, self.rng, self.done = task, random.Random(seed), False
        self.answer: dict[str, Any] | None = None
        if getattr(self, "toolboxes", None):  # (an __init__ that skipped super's has none)
            episode = EpisodeContext(self.episode_id or f"{task['id']}:s{seed}", seed, task)
            for box in self.toolboxes:
                # an MCP server that will not start: reset fails (infra)
                await (box.start(episode) if _takes_episode(box) else box.start())
            self._offer()  # the episode's listing versions its tools
        return await self.setup(task, seed)

    def use(self, box: Any) -> None:
        """Offer `box`'s tools besides this env's own: anything with ``tools()``,
        ``async start(episode)`` (an `EpisodeContext`; or ``start()``), ``async stop()`` and
        ``identity()``, and optionally ``async final_state()`` (`McpTools`). Names must not
        clash (an MCP server's can take a ``prefix``)."""
        self.toolboxes.append(box)
        self._offer()

    def _offer(self) -> None:
        tools = [*self._own_tools, *(t for box in self.toolboxes for t in box.tools())]
        try:
            self.tools = ToolSet(tools, guard=self.side_effect_guard != "off")
        except ValueError as e:
            raise ValueError(f"{self.name}: {e} (give an MCP server a `prefix`)") from None

    async def close(self) -> None:
        """Disconnect the tools from elsewhere (an episode's MCP server ends here)."""
        await release_toolboxes(self)

    def services(self) -> list[dict[str, Any]]:
        return [box.identity() for box in getattr(self, "toolboxes", ())]

    async def final_state(self) -> dict[str, Any] | None:
        """What each toolbox reads when the episode ends (an MCP server's ``final_state``
        calls), by toolbox; None when none reads anything."""
        out = {}
        for box in getattr(self, "toolboxes", ()):
            read = getattr(box, "final_state", None)
            state = await read() if read is not None else None
            if state is not None:
                out[getattr(getattr(box, "server", None), "name", type(box).__name__)] = state
        return out or None

    @abstractmethod
    async def setup(self, task: dict[str, Any], seed: int) -> list[Message]: ...

    @property
    def real_writes(self) -> bool:
        """Writes change real state only with the guard off *and* the task's explicit
        allowance (an isolated tenant); otherwise every write tool runs as a dry run."""
        allowed = self.allow_real_writes or bool(self.task.get("allow_real_writes"))
        return self.side_effect_guard == "off" and allowed

    async def step(self, action: Action) -> StepResult:
        if action.error is not None:
            return StepResult([{"role": "user", "content": action.error.message}])
        if not action.tool_calls:
            return await self.finish(action)
        outcomes = [await self.call(c) for c in action.tool_calls]
        gains = [o.result.evidence_gain for o in outcomes]
        known = [g for g in gains if g is not None]
        return StepResult(
            messages=[o.message() for o in outcomes],
            terminated=self.done or self.answer is not None,
            info={"answer": self.answer} if self.answer is not None else {},
            calls=outcomes,
            evidence_gain=sum(known) if known else None,
        )

    async def call(self, call: ToolCall) -> CallOutcome:
        """Run one call: unknown and forbidden tools are the policy's faults, as values."""
        if call.name not in self.tools:
            known = ", ".join(self.tools.names()) or "none"
            fault = Fault(FaultKind.UNKNOWN_TOOL, f"unknown tool {call.name!r}; tools: {known}")
            return CallOutcome(call, ToolResult.failure(fault))
        t = self.tools[call.name]
        reason = self.forbidden(call)
        if reason:
            fault = Fault(FaultKind.FORBIDDEN_TOOL, reason)
            return CallOutcome(call, ToolResult.failure(fault), t.version, t.effect)
        result = await t(call.arguments, dry_run=not self.real_writes)
        return CallOutcome(call, result, t.version, t.effect)

    def forbidden(self, call: ToolCall) -> str | None:
        """Why the task does not permit this call (None if it does). Default: a task may
        list ``allowed_tools``."""
        allowed = self.task.get("allowed_tools")
        if allowed is not None and call.name not in allowed:
            return f"tool {call.name!r} is not allowed for this task (allowed: {allowed})"
        return None

    async def finish(self, action: Action) -> StepResult:
        """A final answer ends the episode; subclasses may record or check it."""
        self.done = True
        return StepResult([], terminated=True, info={"answer": action.answer})


def guard_value(value: Any, where: str) -> str:
    """A side-effect guard setting as one of `GUARDS`. YAML 1.1 reads an unquoted ``off``
    (and ``no``, ``false``) as false: that is ``off``."""
    if value is False:
        return "off"
    if isinstance(value, str) and value in GUARDS:
        return value
    why = " (YAML reads an unquoted on, yes or true as true)" if value is True else ""
    raise ValueError(
        f"{where}: side_effect_guard {value!r} is not a guard{why}; use 'dry_run' (writes "
        "are simulated, their intended effect recorded: the default) or 'off' (writes run "
        "for real on tasks that allow them)"
    )


@dataclass(frozen=True)
class EpisodeContext:
    """What a toolbox learns of the episode it starts for (`ToolEnv.use`)."""

    episode_id: str
    seed: int
    task: dict[str, Any]


def _takes_episode(box: Any) -> bool:
    """Whether ``box.start`` takes the episode (`McpTools` does; an older toolbox may not)."""
    import inspect

    try:
        return bool(inspect.signature(box.start).parameters)
    except (TypeError, ValueError):
        return False


async def release_toolboxes(env: Env) -> None:
    """Stop every toolbox of `env` (or of the env it wraps): idempotent, so the runner calls
    it after `close` too, for an env whose `close` override forgot ``super()``."""
    for box in getattr(env, "toolboxes", ()):
        try:
            await box.stop()
        except Exception as e:  # never lose an episode to its cleanup
            logging.getLogger("tracerl").warning(
                "%s: stopping its tools failed: %s: %s", env.name, type(e).__name__, e
            )
