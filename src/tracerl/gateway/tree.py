"""Sub-agents and parallel sessions of one episode: a harness that opens several
conversations for one task (a planner and its workers, a sub-agent with a fresh context,
parallel tool agents) has them grouped into **one episode**.

The contract: each conversation names a *child session* by a key derived from the
episode's own key, ``KEY/NAME`` (``NAME``: letters, digits, ``_.:-``, at most 64), given
wherever the episode's key goes: as the API key, in the base URL
(``{base_url}/s/KEY/NAME/v1``... i.e. the episode's base URL with ``/NAME`` before
``/v1``), or as an ``X-Tracerl-Session`` header. The first request naming one opens it. A
harness that shares one client across conversations gets a break at each switch instead
(one session, one history).

What a child session is:

* its own conversation, rendered, recorded and checked for rewrites like any session, its
  turns seeded by its own id (``<episode id>/NAME``), its samples tagged ``agent: NAME``;
* the episode's: its samples are samples of the episode, trained with the episode's
  advantage, and the episode counts once in its group (as the runner's sub-agents,
  `tracerl.rollout.context.subagents`);
* paid for by the episode: its sampled tokens and tool calls go into the root's ledger, so
  ``budgets.sampled_tokens`` bounds the whole tree (each request records what the other
  conversations had spent, ``tree_sampled_tokens``, for replay); ``budgets.steps`` bounds
  each conversation's model turns; at most `MAX_CHILDREN` children per episode;
* failed with the episode: a child the sampler failed makes the episode the environment's
  (unknown, for a fault of the gateway itself), as the root's own would.

The receipt's ``children`` lists each (name, the root's step when it opened, its
requests, samples, sampled tokens, history breaks, stop); each child's samples carry the
child's own receipt, a gateway receipt of that conversation (its own tools, account and
breaks, the root's ``unmanaged`` guard: `tracerl.gateway.recording`), so exact replay
replays each conversation (`tracerl.gateway.replay`).
"""

from __future__ import annotations

import re
from typing import Any

from tracerl.gateway.chat import GatewayError
from tracerl.types import StopReason

NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
MAX_CHILDREN = 16


class SessionTree:
    """The child sessions of one root session (`root`), and, once it finishes, their
    episodes (`children`) and receipt records (`records`)."""

    def __init__(self, root: Any) -> None:
        self.root = root
        self.sessions: dict[str, Any] = {}
        self.children: list[Any] = []  # the child episodes (what `finish_episode` appends)
        self.records: list[dict[str, Any]] = []  # the receipt's ``children``

    def open(self, name: str) -> Any:
        """The child session `name`, opened on first use."""
        if name in self.sessions:
            return self.sessions[name]
        root = self.root
        if root.root_session is not None:
            raise GatewayError(400, "a child session cannot open children of its own", "nested")
        if not NAME.fullmatch(name):
            raise GatewayError(
                400,
                f"child session name {name!r}: use letters, digits and _.:- (at most 64)",
                "bad_session_name",
            )
        if root.closed:
            raise GatewayError(409, f"session {root.episode_id} has ended", "closed")
        if len(self.sessions) >= MAX_CHILDREN:
            raise GatewayError(
                400, f"an episode opens at most {MAX_CHILDREN} child sessions", "too_many_sessions"
            )
        child = type(root)(
            f"{root.token}/{name}",
            root.policy,
            root.cfg,
            seed=root.seed,
            episode_id=f"{root.episode_id}/{name}",
            task=root.task,
            env=root.env,
            loop=root.loop,
            template_kwargs=root.template_kwargs,
        )
        child.root_session, child.agent = root, name
        child.opened_at = root.conv.step if root.conv is not None else 0
        # the receipt's link to its parent, as a runner sub-agent's
        child.parent = {
            "episode_id": root.episode_id,
            "replay_id": root.replay_id,
            "step": child.opened_at,
        }
        self.sessions[name] = child
        return child

    def tokens_left(self, session: Any) -> int | None:
        """What ``budgets.sampled_tokens`` leaves the whole tree (None: no such budget);
        the root's ledger counts every session's tokens."""
        budget = session.cfg.budgets.sampled_tokens
        root = session.root_session or session
        return None if budget is None else budget - root.ledger.used["sampled_tokens"]

    def others_spent(self, session: Any) -> int:
        """The sampled tokens the rest of the tree has spent (a root's children, or a
        child's root and siblings): what `session`'s budget checks count beyond its own.
        Each request records it (``tree_sampled_tokens``), so that exact replay of one
        conversation on its own meets the same budget (`tracerl.gateway.replay`)."""
        root = session.root_session or session
        if session.root_session is not None:
            return root.ledger.used["sampled_tokens"] - session.ledger.used["sampled_tokens"]
        return sum(c.ledger.used["sampled_tokens"] for c in self.sessions.values())

    def paid(self, session: Any, sampled: int, calls: int) -> None:
        """A child's turn, paid for in the root's ledger."""
        if session.root_session is not None:
            used = session.root_session.ledger.used
            used["sampled_tokens"] += sampled
            used["tool_calls"] += calls

    def finish(self) -> None:
        """Close every child session: its episode joins the root's, its faults the root's."""
        root = self.root
        for name, child in self.sessions.items():
            episode = child.finish(child_stop(child))
            self.children.append(episode)
            if child.env_fault or child.unknown_fault:
                root.env_fault |= child.env_fault
                root.unknown_fault |= child.unknown_fault
                root.error = root.error or f"child session {name}: {child.error}"
            used = episode.receipt.ledger.get("used", {})
            self.records.append(
                {
                    "agent": name,
                    "step": child.opened_at,
                    "session": child.episode_id,
                    "replay_id": episode.receipt.replay_id,
                    "requests": child.requests,
                    "samples": len(episode.trajectories),
                    "sampled_tokens": used.get("sampled_tokens", 0),
                    "tool_calls": used.get("tool_calls", 0),
                    "history_breaks": len(child.breaks),
                    "stop_reason": episode.stop_reason.value,
                    "attribution": episode.attribution.value,
                }
            )


def child_stop(child: Any) -> StopReason:
    """How a child conversation ended when its episode did: a budget that refused it, else
    its last turn (an answer, one cut by the token limit, or calls nobody answered)."""
    if child.stop is not None:
        return child.stop
    if not child.records:
        return StopReason.ENV_TERMINATED
    response = child.records[max(child.records)].get("response") or {}
    if response.get("tool_calls"):
        return StopReason.ENV_TERMINATED  # the harness moved on without answering its calls
    if response.get("finish_reason") == "length":
        return StopReason.MAX_TOKENS
    return StopReason.ANSWERED
