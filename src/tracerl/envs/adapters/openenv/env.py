"""The `openenv` environment: an OpenEnv environment's episodes, one session each, scored by
the environment's own reward. The package docstring (`tracerl.envs.adapters.openenv`) says
what each setting does."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
import shlex
import time
from typing import Any

from tracerl.envs.adapters.openenv.actions import (
    action_field,
    action_problems,
    check_action_schema,
    to_action,
)
from tracerl.envs.adapters.openenv.client import PROTOCOL, Busy, Down, Invalid, Session
from tracerl.envs.adapters.openenv.server import Launch, Served, serve
from tracerl.envs.base import CallOutcome, Message, StepResult, ToolEnv
from tracerl.envs.parsers import Action
from tracerl.envs.tools import ToolResult
from tracerl.errors import UserError
from tracerl.rewards.compose import RewardContext, Score
from tracerl.types import Fault, FaultKind, ToolCall

OPENENV_REWARD = """
components:
  - {name: attribution, fn: attribution_label, layer: attribution, weight: 0.0}
  - {name: openenv_reward, fn: reward, layer: outcome, weight: 1.0}
"""
"""The environment's own reward: the sum of the rewards its steps returned."""

SPLITS = ("train", "heldout")
HELDOUT_OFFSET = 5_000_000
"""Held-out reset seeds start this far above the training ones (``seed * 10**7`` apart)."""
OBSERVATION_CAP = 4000
"""Observations kept in a step's record up to this many characters of JSON."""

UNFINISHED = (
    "the environment is not done after one reply: tracerl's one-reply limit ended the "
    "episode, so its reward so far is not the policy's outcome (single_step: true scores it)"
)

log = logging.getLogger("tracerl")
_warned: set[str] = set()


class OpenEnv(ToolEnv):
    """An OpenEnv environment, one reply per episode, its reward the environment's own."""

    name = "openenv"
    version = "1.0"
    """The adapter's own version; once the server answered, an instance's also names
    openenv-core's release and the environment (``1.0/openenv-core-0.3.0/ArithEnv-1.0.0``)."""
    reward_components = OPENENV_REWARD

    def __init__(
        self,
        base_url: str | None = None,
        *,
        app: str | None = None,
        command: str | list[str] | None = None,
        python: str | None = None,
        cwd: str | None = None,
        env_vars: dict[str, str] | None = None,
        action: str | None = None,
        observation: str | None = None,
        instruction: str | None = None,
        reset: dict[str, Any] | None = None,
        tasks: dict[str, list[dict[str, Any]]] | None = None,
        seed: int = 0,
        train_size: int = 1000,
        heldout_size: int = 200,
        check_actions: str | list[Any] | None = None,
        start_timeout_s: float = 120.0,
        message_timeout_s: float = 60.0,
        session_wait_s: float = 120.0,
        single_step: bool = False,
        side_effect_guard: str = "dry_run",
    ) -> None:
        """The settings are the package's (`tracerl.envs.adapters.openenv`): where the server
        is, how replies become actions, the tasks, and check-env's reply."""
        super().__init__(side_effect_guard=side_effect_guard)
        self.launch = _launch(base_url, app, command, python, cwd, env_vars, start_timeout_s)
        for key, value in (("action", action), ("observation", observation)):
            if value is not None and (not isinstance(value, str) or not value):
                raise UserError(f"{key}: a non-empty string, got {value!r:.80}")
        for key, value in (("train_size", train_size), ("heldout_size", heldout_size)):
            if not _count(value) or not 0 < value <= HELDOUT_OFFSET:
                raise UserError(f"{key}: a number of tasks, 1 to {HELDOUT_OFFSET}, got {value!r}")
        if not _count(seed) or seed < 0:
            raise UserError(f"seed: a non-negative integer, got {seed!r}")
        if reset is not None and not isinstance(reset, dict):
            raise UserError(f"reset: the arguments of every reset, a mapping, got {reset!r:.80}")
        if not isinstance(single_step, bool):
            raise UserError(f"single_step: true or false, got {single_step!r:.80}")
        self.action_mode, self.observation_field = action, observation
        self.instruction = instruction
        self.reset_kwargs = dict(reset or {})
        self.seed, self.sizes = seed, {"train": train_size, "heldout": heldout_size}
        self.explicit = _explicit_tasks(tasks)
        self.splits = tuple(self.explicit) if self.explicit else SPLITS
        self.check_actions = check_actions
        self.message_timeout_s, self.session_wait_s = message_timeout_s, session_wait_s
        self.single_step = single_step
        self.session: Session | None = None
        self.served: Served | None = None

    # ---- the server, before any episode -------------------------------------------------------
    def prepare(self) -> None:
        """Start (or find) the server, once per process, and read what it serves."""
        self.served = serve(self.launch)
        meta = self.served.metadata
        core = f"openenv-core-{self.served.openenv_version or 'unknown'}"
        self.version = f"{type(self).version}/{core}/{meta.get('name')}-{meta.get('version')}"  # type: ignore[misc]
        self.action_field = action_field(self.action_mode, self.served.schema)
        check_action_schema(self.served.schema)

    def services(self) -> list[dict[str, Any]]:
        if self.served is None:
            return []
        meta = self.served.metadata
        return [
            {
                "name": meta.get("name"),
                "version": meta.get("version"),
                "protocol": PROTOCOL,
                "openenv_core": self.served.openenv_version,
                "url": self.served.url,
            }
        ]

    # ---- tasks ----------------------------------------------------------------------------------
    def pool(self, split: str) -> list[dict[str, Any]]:
        if split not in self.splits:
            raise ValueError(f"openenv: unknown split {split!r}; valid: {', '.join(self.splits)}")
        if self.explicit:
            given = self.explicit[split]
            return [_task(split, i, {**self.reset_kwargs, **r}) for i, r in enumerate(given)]
        first = self.seed * 2 * HELDOUT_OFFSET + (HELDOUT_OFFSET if split == "heldout" else 0)
        seeds = range(first, first + self.sizes[split])
        return [_task(split, s, {**self.reset_kwargs, "seed": s}) for s in seeds]

    def sample_tasks(self, n: int, *, seed: int = 0, split: str = "train") -> list[dict[str, Any]]:
        pool = self.pool(split)
        order = random.Random(f"openenv:{split}:{seed}")
        return [pool[i] for i in order.sample(range(len(pool)), min(n, len(pool)))]

    # ---- the episode ----------------------------------------------------------------------------
    async def setup(self, task: dict[str, Any], seed: int) -> list[Message]:
        if self.served is None or not self.served.alive():
            await asyncio.to_thread(self.prepare)  # check-env resets without the runner
        assert self.served is not None
        kwargs = {**task.get("reset", {}), "episode_id": self.episode_id or f"{task['id']}:s{seed}"}
        first = await self._open(self.served.url, kwargs)
        self.steps_taken = 0
        text = self.render(first["observation"])
        if self.instruction:
            text = f"{text}\n\n{self.instruction}"
        return [{"role": "user", "content": text}]

    async def _open(self, url: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        """A fresh session, reset: waits for a free session while the server is at its limit
        (inside the episode's clock: `reset` is the episode's first act)."""
        deadline, delay = time.monotonic() + self.session_wait_s, 0.2
        while True:
            self.session = Session(url, message_timeout_s=self.message_timeout_s)
            try:
                return await self.session.reset(**kwargs)
            except Busy as e:
                await self.session.close()
                most = f" ({e.max_sessions})" if e.max_sessions else ""
                _warn_once(
                    f"busy:{url}",
                    f"openenv: the server at {url} is at its limit of sessions{most}: "
                    "episodes wait for a free one inside their own clock (the wait counts "
                    "against rollout.budgets.wall_time_s); serve as many sessions as episodes "
                    "run at once (max_concurrent_envs in openenv's create_app)",
                )
                if time.monotonic() > deadline:
                    raise Down(f"no free session on {url} in {self.session_wait_s:g} s") from None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    def render(self, observation: dict[str, Any]) -> str:
        """An observation as the model reads it: the text of `observation` (the field), else
        of its one text field, else the whole observation as JSON."""
        name = self.observation_field
        if name is None:
            texts = [k for k, v in observation.items() if isinstance(v, str)]
            name = texts[0] if len(texts) == 1 else None
        if name is None:
            return json.dumps(observation, ensure_ascii=False, sort_keys=True)
        if name not in observation:
            raise UserError(
                f"observation: the observation has no field {name!r}; it has {sorted(observation)}"
            )
        value = observation[name]
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)

    def to_action(self, reply: str) -> dict[str, Any]:
        """The OpenEnv action the reply stands for; ValueError when it stands for none."""
        return to_action(reply, self.action_field)

    async def step(self, action: Action) -> StepResult:
        """One reply: the environment's step on the action it stands for; the episode ends."""
        if action.error is not None:
            return StepResult([{"role": "user", "content": action.error.message}])
        reply = action.text or action.answer or ""
        assert self.session is not None and self.served is not None, "step before reset"
        try:
            payload = self.to_action(reply)
        except ValueError as e:  # the policy wrote no action
            return self._refused(reply, str(e))
        try:
            result = await self.session.step(payload)
        except Invalid as e:  # refused: the policy's if the action does not fit its schema
            problem = action_problems(self.served.schema, payload)
            if problem is not None:
                return self._refused(reply, f"{e} (the action's schema: {problem})")
            return self._failed(reply, e)  # it fits: the environment's step broke
        except (Down, Busy) as e:  # the environment's: the session cannot go on
            return self._failed(reply, e)
        self.steps_taken += 1
        if not result["done"] and not self.single_step:
            _warn_once("done", f"openenv: {UNFINISHED}; such episodes are never trained on")
        observation = json.dumps(result["observation"], ensure_ascii=False, sort_keys=True)
        record = {
            "reward": result["reward"],
            "done": result["done"],
            "observation": result["observation"]
            if len(observation) <= OBSERVATION_CAP
            else {"truncated": observation[:OBSERVATION_CAP]},
        }
        return self._ended(reply, record)

    def _ended(self, reply: str, record: dict[str, Any]) -> StepResult:
        self.done = True
        self.answer = {"text": reply, "reply": reply, "citations": []}
        return StepResult([], terminated=True, info={"answer": self.answer, "openenv": record})

    def _refused(self, reply: str, why: str) -> StepResult:
        """The reply is no action the environment takes: the episode ends, the policy's 0."""
        return self._ended(reply, {"error": why, "reward": None, "done": True})

    def _failed(self, reply: str, e: Exception) -> StepResult:
        """The environment failed the step: the episode is its failure, never trained on."""
        call = ToolCall("openenv_step", "openenv_step", {"reply": reply[:2000]})
        return StepResult([], calls=[CallOutcome(call, ToolResult.failure(_fault(e)))])

    async def final_state(self) -> dict[str, Any] | None:
        """The environment's ``state`` as the episode left it (an episode that never reached
        the server has none)."""
        if self.session is None or not getattr(self, "steps_taken", 0):
            return None
        return {"openenv_state": await self.session.state()}

    async def close(self) -> None:
        session, self.session = self.session, None
        if session is not None:
            await session.close()
        await super().close()

    def check_script(self, task: dict[str, Any]) -> list[Action]:
        """The reply `check_actions` gives for `task` (the first of a list, or what an import
        path's function returns for the task); none given: an empty reply."""
        given = self.check_actions
        if isinstance(given, str):
            from tracerl.imports import load_object

            reply = load_object(given, "openenv check_actions function")(task)
        elif isinstance(given, list) and given:
            reply = given[0]
        else:
            reply = ""
        text = reply if isinstance(reply, str) else json.dumps(reply)
        return [Action(text=text, answer=text)]

    # ---- the verifier ---------------------------------------------------------------------------
    def reward(self, ctx: RewardContext) -> Score:
        """The sum of the rewards the environment's steps returned (None counts 0); 0, the
        policy's, when its reply was no action the environment takes, or never reached it;
        undecided (never trained on) when the environment was not done after the reply,
        unless `single_step` says to score it."""
        steps = [
            s["info"]["openenv"]
            for s in ctx.steps
            if isinstance((s.get("info") or {}).get("openenv"), dict)
        ]
        if not steps:
            return Score(0.0, {"why": "no action reached the environment", "stop": ctx.stop_reason})
        rewards = [s.get("reward") for s in steps]
        evidence: dict[str, Any] = {"rewards": rewards[:50], "done": steps[-1].get("done")}
        errors = [s["error"] for s in steps if s.get("error")]
        total = float(sum(r for r in rewards if r is not None))
        if errors:
            evidence["why"] = errors[-1][:300]
        elif steps[-1].get("done") is False and not self.single_step:
            evidence["why"] = UNFINISHED
            return Score(total, evidence, decided=False)
        return Score(total, evidence)


def _launch(
    base_url: Any, app: Any, command: Any, python: Any, cwd: Any, env_vars: Any, timeout: Any
) -> Launch:
    """Where the server is, checked: exactly one of a URL, an app, a command."""
    given = [k for k, v in (("base_url", base_url), ("app", app), ("command", command)) if v]
    if len(given) != 1:
        raise UserError(
            f"openenv: give exactly one of base_url, app, command (got {given or 'none'})",
            "base_url: a server already running; app: module:attribute of an OpenEnv app "
            "tracerl serves; command: a command that serves it on {port}",
        )
    argv = shlex.split(command) if isinstance(command, str) else command
    if argv is not None and not (argv and all(isinstance(a, str) for a in argv)):
        raise UserError(f"command: a command line or a list of strings, got {command!r:.80}")
    if app is not None and not (isinstance(app, str) and re.fullmatch(r"[\w.]+(:[\w.]+)?", app)):
        raise UserError(f"app: module:attribute (e.g. my_env.server.app:app), got {app!r:.80}")
    if env_vars is not None and not isinstance(env_vars, dict):
        raise UserError(f"env_vars: a mapping of environment variables, got {env_vars!r:.80}")
    return Launch(
        url=base_url,
        app=app,
        command=tuple(argv) if argv else None,
        python=python,
        cwd=cwd,
        env=tuple(sorted((str(k), str(v)) for k, v in (env_vars or {}).items())),
        start_timeout_s=float(timeout),
    )


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _explicit_tasks(tasks: Any) -> dict[str, list[dict[str, Any]]]:
    if tasks is None:
        return {}
    if not isinstance(tasks, dict) or not tasks:
        raise UserError(
            f"tasks: splits of reset arguments, got {tasks!r:.80}",
            "e.g. tasks: {train: [{seed: 1}], heldout: [{seed: 2}]}",
        )
    for split, given in tasks.items():
        if not isinstance(given, list) or not given or not all(isinstance(r, dict) for r in given):
            raise UserError(
                f"tasks.{split}: a list of reset arguments (mappings), got {given!r:.80}"
            )
    return {str(k): v for k, v in tasks.items()}


def _task(split: str, index: int, reset: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": f"openenv-{split}-{index}",
        "split": split,
        "reset": json.loads(json.dumps(reset)),
    }


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message)


def _fault(e: Exception) -> Fault:
    """A failed session as the environment's fault; never retried: the session is gone, and
    with it the episode's state on the server."""
    code = getattr(e, "code", None)
    kinds = {"TIMEOUT": FaultKind.TIMEOUT, "CONNECT": FaultKind.CONNECTION_REFUSED}
    kind = kinds.get(str(code), FaultKind.SERVER_ERROR)
    return Fault(kind, f"openenv: {e}", retryable=False, exception_type=type(e).__name__)
