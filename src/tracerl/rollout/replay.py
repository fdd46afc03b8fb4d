"""Replay: re-run a recorded episode and say exactly where it differs.

Exact replay runs the episode again through the same runner, with the recorded policy tokens
(a scripted sampler) and the recorded environment results of every attempt (a `RecordedEnv`),
the recorded clock, template values, config and seed. It must reproduce the token ids, the
loss mask and the stop reason exactly; anything else is a regression in rendering, parsing,
budgeting or attribution, and the report names the first difference.

Live replay (`tracerl.rollout.live_replay`) sends the recorded actions to the live
environment and reports, step by step, which observations drifted.

An episode an agent harness drove (its receipt names an `agent`: `tracerl.gateway`) is
replayed by the gateway, a layer up: `tracerl.gateway.replay.replay_exact` and `replay_live`
replay any episode, passing their gateway replays in here as `agent`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tracerl.envs.base import CallOutcome, Env, Message, StepResult
from tracerl.envs.parsers import Action, get_parser
from tracerl.envs.tools import Tool, ToolSet
from tracerl.errors import UserError
from tracerl.rollout.budget import RolloutConfig
from tracerl.rollout.context import recorded_summaries
from tracerl.rollout.runner import Policy, run_episode
from tracerl.rollout.sampler import SampleRequest, ScriptedSampler
from tracerl.types import Receipt, Source, ToolCall, Trajectory, TrajectoryError


class ReplayError(UserError, RuntimeError):
    """The recording cannot be replayed (missing, or the replay asked for something else)."""


def _no_agent_replay(receipt: Receipt) -> ReplayError:
    return ReplayError(
        f"episode {receipt.episode_id} was driven by an agent harness: replay it with "
        "tracerl.gateway.replay (`tracerl replay` does)"
    )


def _steps(trajectories: Sequence[Trajectory], agent: str = "") -> dict[int, dict[str, Any]]:
    """The step records of one agent of the episode ("": its own; ``d0``...: a sub-agent's)."""
    return {s["step"]: s for t in trajectories if t.agent == agent for s in t.steps}


def _agent_of(episode_id: str | None, root: str) -> str:
    """Which agent asks: a sub-agent's episode id is its root's, then its path."""
    return (episode_id or "")[len(root) + 1 :] if (episode_id or "") != root else ""


def _receipt(trajectories: Sequence[Trajectory]) -> Receipt:
    if not trajectories[0].receipt:
        raise ReplayError("this trajectory has no receipt; only runner episodes can be replayed")
    return Receipt.from_dict(trajectories[0].receipt)


def _recorded_tools(receipt: Receipt) -> ToolSet:
    tools = []
    for schema in receipt.tool_schemas:
        fn = schema["function"]
        tools.append(
            Tool(
                name=fn["name"],
                description=fn["description"],
                parameters=fn["parameters"],
                fn=None,  # type: ignore[arg-type] - never called: results come from the record
                effect=schema.get("x-effect", "read"),
                version=receipt.tool_versions.get(fn["name"], "?"),
            )
        )
    return ToolSet(tools, guard=False)


def _action(record: dict[str, Any]) -> Action:
    a = record["action"]
    calls = tuple(ToolCall.from_dict(c) for c in a.get("tool_calls", []))
    return Action(text="", tool_calls=calls, answer=a.get("answer"))


def recorded_policy(
    trajectories: Sequence[Trajectory],
    receipt: Receipt,
    renderer: Any,
    missing: Callable[[str], Exception] = ReplayError,
) -> Policy:
    """The recorded policy: each model turn answered with the tokens (and log-probs) it was
    recorded with; a turn never recorded raises `missing` (the replay asked for more)."""
    turns = {
        (t.agent, s.step): s for t in trajectories for s in t.segments if s.source is Source.POLICY
    }

    def key(req: SampleRequest) -> tuple[str, int]:
        return _agent_of(req.episode_id, receipt.episode_id), req.turn

    def tokens(req: SampleRequest) -> list[int]:
        if key(req) not in turns:
            agent = f" of sub-agent {key(req)[0]}" if key(req)[0] else ""
            raise missing(f"the replay sampled turn {req.turn}{agent}, which was never recorded")
        return list(turns[key(req)].token_ids)

    def logprobs(req: SampleRequest) -> list[float]:
        return list(turns[key(req)].logprobs or ())

    sampler = ScriptedSampler(tokens, logprobs=logprobs, policy_version=receipt.policy_version or 0)
    return Policy(sampler, renderer, get_parser(receipt.parser), receipt.model_id)


class RecordedEnv(Env):
    """Answers each `step` with the recorded result of that attempt, in recorded order."""

    def __init__(
        self,
        receipt: Receipt,
        steps: dict[int, dict[str, Any]],
        agents: dict[str, dict[int, dict[str, Any]]] | None = None,
    ) -> None:
        self.name, self.version = receipt.env["name"], receipt.env["version"]  # type: ignore[misc]
        self.side_effect_guard = receipt.side_effect_guard
        self.tools = _recorded_tools(receipt)
        self.receipt = receipt
        self.queues = {
            agent: [(k, a) for k, rec in sorted(s.items()) for a in rec.get("attempts", [])]
            for agent, s in {**(agents or {}), "": steps}.items()
        }
        self.queue = self.queues[""]
        self.steps = steps
        self.error: str | None = None  # the first way the replay left the recording

    async def reset(self, task: dict[str, Any], seed: int) -> list[Message]:
        if self.receipt.error and self.receipt.error.startswith("reset failed"):
            raise RuntimeError(f"recorded: {self.receipt.error}")
        return [dict(m) for m in self.receipt.reset_messages]

    async def step(self, action: Action) -> StepResult:
        return await self.step_as("", action)

    async def step_as(self, agent: str, action: Action) -> StepResult:
        """A step of one agent of the episode (a sub-agent's calls run here too)."""
        queue = self.queues.get(agent, [])
        who = f" (sub-agent {agent})" if agent else ""
        if not queue:
            return self._diverged(
                f"the replay asked the environment for more steps than recorded{who}"
            )
        k, attempt = queue.pop(0)
        got = [(c.id, c.name, c.arguments) for c in action.tool_calls]
        if "exception" in attempt:
            raise RuntimeError(f"recorded env exception: {attempt['exception']}")
        want = [(c["call_id"], *c["action"].values()) for c in attempt["calls"]]
        if got != want and (got or want):
            return self._diverged(f"step {k}{who}: the replay sent {got}, the recording has {want}")
        return StepResult(
            messages=[dict(m) for m in attempt["messages"]],
            terminated=attempt["terminated"],
            truncated=attempt["truncated"],
            info=attempt["info"],
            calls=[CallOutcome.from_record(c) for c in attempt["calls"]],
            evidence_gain=attempt["evidence_gain"],
        )

    def tool_schemas(self) -> list[dict[str, Any]]:
        return super().tool_schemas() if self.receipt.tools_in_prompt else []

    def _diverged(self, message: str) -> StepResult:
        """Remember the first divergence (the runner would treat a raise as an env fault)."""
        self.error = self.error or message
        raise ReplayError(message)

    def sample_tasks(self, n: int, *, seed: int = 0, split: str = "train") -> list[dict]:
        return [self.receipt.task] * n


@dataclass
class ReplayReport:
    episode_id: str
    ok: bool
    first_difference: str | None = None
    stop_reason: tuple[str, str] | None = None  # (recorded, replayed)


# the replay of an agent harness's episode (`tracerl.gateway.replay`): exact (trajectories,
# renderer); its live replay: `tracerl.rollout.live_replay.AgentLiveReplay`
AgentExactReplay = Callable[[Sequence[Trajectory], Any], Awaitable["ReplayReport"]]


async def replay_exact(
    trajectories: Sequence[Trajectory],
    *,
    renderer: Any = None,
    agent: AgentExactReplay | None = None,
) -> ReplayReport:
    """Replay against the recorded tool I/O; compare token ids, masks and stop reason.

    An episode an agent harness drove is replayed by `agent` (`tracerl.gateway.replay`
    passes its own); without one it raises `ReplayError`."""
    receipt = _receipt(trajectories)
    steps = _steps(trajectories)
    if renderer is None:
        from tracerl.models.refs import load_renderer

        renderer = load_renderer(receipt.model_id)  # the tokenizer alone: no weights
    if renderer.template_hash != receipt.template_hash:
        return ReplayReport(receipt.episode_id, False, "the chat template changed (hash differs)")
    if receipt.agent is not None:  # an agent harness drove it: replay its requests
        if agent is None:
            raise _no_agent_replay(receipt)
        return await agent(trajectories, renderer)

    policy = recorded_policy(trajectories, receipt, renderer)
    elapsed = iter(receipt.ledger.get("elapsed_s", []))

    async def no_sleep(_: float) -> None:
        return None

    agents = {t.agent for t in trajectories if t.agent}
    env = RecordedEnv(receipt, steps, {a: _steps(trajectories, a) for a in agents})
    children = {a: _recorded_run(_receipt_of(trajectories, a)) for a in agents}
    for t in trajectories:  # what each parent was shown of its children's answers
        for rec in (t.receipt or {}).get("children", []):
            if "result" in rec and rec["agent"] in children:
                children[rec["agent"]]["result"] = rec["result"]
    try:
        episode = await run_episode(
            env,
            receipt.task,
            policy,
            RolloutConfig.model_validate(receipt.rollout),
            seed=receipt.seed,
            episode_id=receipt.episode_id,
            clock=lambda step: next(elapsed, 0.0),
            sleep=no_sleep,
            template_kwargs=receipt.template_kwargs,
            summarize=recorded_summaries(receipt.compactions),
            children_replay=children,
        )
    except (ReplayError, TrajectoryError) as e:
        return ReplayReport(receipt.episode_id, False, str(e))
    if env.error:
        return ReplayReport(receipt.episode_id, False, env.error)
    diff = first_difference(trajectories, episode.trajectories)
    stops = (receipt.stop_reason or "", episode.stop_reason.value)
    if diff is None and stops[0] != stops[1]:
        diff = f"stop reason: recorded {stops[0]!r}, replayed {stops[1]!r}"
    return ReplayReport(receipt.episode_id, diff is None, diff, stops)


def _receipt_of(trajectories: Sequence[Trajectory], agent: str) -> Receipt:
    return Receipt.from_dict(next(t.receipt for t in trajectories if t.agent == agent))


def _recorded_run(receipt: Receipt) -> dict[str, Any]:
    """What a sub-agent's replay takes from its own receipt: its clock and summaries."""
    elapsed = iter(receipt.ledger.get("elapsed_s", []))
    return {
        "clock": lambda step: next(elapsed, 0.0),
        "summarize": recorded_summaries(receipt.compactions),
    }


def first_difference(a: Sequence[Trajectory], b: Sequence[Trajectory]) -> str | None:
    """The first place where two episodes' token ids, authors or loss masks differ."""
    if len(a) != len(b):
        return f"recorded {len(a)} samples, replayed {len(b)}"
    for i, (ta, tb) in enumerate(zip(a, b, strict=True)):
        ids_a, ids_b, src_a, src_b = ta.token_ids, tb.token_ids, ta.sources, tb.sources
        mask_a, mask_b = ta.loss_mask, tb.loss_mask
        for j in range(max(len(ids_a), len(ids_b))):
            if j >= len(ids_a) or j >= len(ids_b):
                return f"sample {i}: recorded {len(ids_a)} tokens, replayed {len(ids_b)}"
            if ids_a[j] != ids_b[j] or mask_a[j] != mask_b[j] or src_a[j] != src_b[j]:
                return (
                    f"sample {i}, token {j}: recorded {ids_a[j]} ({src_a[j].value}, mask "
                    f"{mask_a[j]}), replayed {ids_b[j]} ({src_b[j].value}, mask {mask_b[j]})"
                )
    return None
