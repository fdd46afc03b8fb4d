"""The environment contract: what every environment must pass before it is trained on.

`tracerl.rollout.env_check.check_env` runs these checks (`run_env_checks`), handing the
reward check its scripted episodes played through the rollout engine; everything here needs
the environment alone.

Like Gymnasium's env checker, but for the agent contract:

* versions — the env has a name and a version, every tool a version;
* schemas — every tool schema is a valid JSON-schema object the templates can render;
* reset determinism — the same task and seed give the same observation (messages, and the
  same tokens when a renderer is given), three times over, on fresh instances;
* step determinism — the env's scripted action sequence gives the same results twice (each
  episode a check plays has an id of its own: a server keyed by it gives each a fresh world);
* dry runs — every write tool has a dry-run path, the script exercises it, and under the
  side-effect guard the env's real state is unchanged afterwards (an env built with the
  guard off, as a config that writes for real trains it, is checked on a copy with the
  guard on, and the check says so; every other check runs it as it was built);
* splits — every declared split samples tasks (JSON, with ids), the same ones for the same
  seed, and no task id is in two splits;
* reward — the env's own verifier (if it has one) scores the scripted actions, played
  through the rollout engine (by the caller's `ScriptedEpisodes`), without crashing, and
  counts at least one a success (a verifier that fails the reference solution is suspect);
* mcp servers — for tools from MCP servers: each server reports its name and version, and
  fresh starts list the same tools at the same versions; their write tools' dry-run paths
  are probed under the guard when the script does not use them (`tracerl.envs.mcp.check`).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from tracerl.envs.base import Env
from tracerl.envs.registry import make

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_NOTE = "note: "  # a check that passed and says how
_WARN = "warning: "  # a check that passed with something the user should act on


class EnvCheckError(AssertionError):
    pass


@dataclass
class CheckReport:
    env: str
    passed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failed

    def __str__(self) -> str:
        lines = [f"check_env({self.env}): {'ok' if self.ok else 'FAILED'}"]
        lines += [f"  ok    {p}" for p in self.passed]
        lines += [f"  WARN  {w}" for w in self.warnings]
        lines += [f"  FAIL  {f}" for f in self.failed]
        return "\n".join(lines)


# (factory, probe, tasks, renderer, seed) -> the episodes of the env's `check_script` on
# `tasks`, played through the rollout engine (`tracerl.rollout.env_check.scripted_episodes`)
ScriptedEpisodes = Callable[
    [Callable[[], Env], Env, list[dict[str, Any]], Any, int], Awaitable[list[Any]]
]


def run_env_checks(
    env: str | Callable[[], Env],
    scripted_episodes: ScriptedEpisodes,
    *,
    renderer: Any = None,
    seed: int = 0,
    raise_on_failure: bool = True,
    label: str | None = None,
    on_result: Callable[[str], None] | None = None,
) -> CheckReport:
    """Check an environment (a name `make` resolves, or a zero-argument factory); the reward
    check scores the episodes `scripted_episodes` plays (`tracerl.rollout.env_check`).
    `on_result` is told each check's line (``  ok    versions``) as soon as it is known: a
    check that builds an index or plays episodes takes seconds."""
    factory = (lambda: make(env)) if isinstance(env, str) else env
    report = CheckReport(
        label or (env if isinstance(env, str) else getattr(env, "__name__", "env"))
    )
    checks = [
        _versions,
        _schemas,
        _splits,
        _reset_determinism,
        _step_determinism,
        _dry_runs,
        _reward_check(scripted_episodes),
    ]
    try:
        if getattr(factory(), "toolboxes", None):
            checks.append(_mcp_servers)
    except Exception:  # an env that cannot be built fails every check, with its error
        pass
    for check in checks:
        label = check.__name__.strip("_").replace("_", " ")
        try:
            problem = asyncio.run(check(factory, renderer, seed))
        except Exception as e:  # a crashing env fails the check, with its error
            problem = f"raised {type(e).__name__}: {e}"
        lines = _record(report, label, problem)
        if on_result is not None:
            for line in lines:
                on_result(line)
    if raise_on_failure and not report.ok:
        raise EnvCheckError(str(report))
    return report


def _record(report: CheckReport, label: str, problem: str | None) -> list[str]:
    """File one check's outcome in `report`; its lines as `str(report)` shows them."""
    if problem and problem.startswith(_WARN):  # passed: "warning: W; note: N"
        warning, _, note = problem.removeprefix(_WARN).partition("; " + _NOTE)
        report.passed.append(f"{label}: {note}" if note else label)
        report.warnings.append(f"{label}: {warning}")
        return [f"  ok    {report.passed[-1]}", f"  WARN  {report.warnings[-1]}"]
    if problem and problem.startswith(_NOTE):  # passed, with something to say
        report.passed.append(f"{label}: {problem.removeprefix(_NOTE)}")
        return [f"  ok    {report.passed[-1]}"]
    if problem:
        report.failed.append(f"{label}: {problem}")
        return [f"  FAIL  {report.failed[-1]}"]
    report.passed.append(label)
    return [f"  ok    {label}"]


async def _versions(factory: Callable[[], Env], renderer: Any, seed: int) -> str | None:
    env = factory()
    if not env.name or not env.version:
        return f"{type(env).__name__} needs class attributes `name` and `version`"
    for name in ("reset", "step", "close"):
        if not inspect.iscoroutinefunction(getattr(env, name)):
            return f"{name} must be an async method"
    missing = [t.name for t in env.tools if not t.version]
    return f"tools without a version: {missing}" if missing else None


async def _schemas(factory: Callable[[], Env], renderer: Any, seed: int) -> str | None:
    for s in factory().tool_schemas():
        fn = s.get("function", {})
        name, params = fn.get("name", "?"), fn.get("parameters")
        if s.get("type") != "function" or not _NAME.match(str(fn.get("name"))):
            return f"tool {name!r}: schema needs type 'function' and a valid name"
        if not fn.get("description"):
            return f"tool {name!r}: empty description (write a docstring)"
        if not isinstance(params, dict) or params.get("type") != "object":
            return f"tool {name!r}: parameters must be a JSON-schema object"
        props = params.get("properties", {})
        extra = set(params.get("required", [])) - set(props)
        if extra:
            return f"tool {name!r}: required names {sorted(extra)} are not properties"
        for pname, p in props.items():
            if not any(k in p for k in ("type", "anyOf", "enum", "$ref", "oneOf")):
                return f"tool {name!r}: property {pname!r} has no type"
        json.dumps(s)
    return None


def _own_episode(env: Env, check: str) -> Env:
    """`env` with an episode id of its own, for every episode a check plays: a server shared
    by episodes and keyed by ``${episode_id}`` (``inject``) gives each a world of its own,
    as training does (under one id, a run would see what the one before it left there)."""
    env.episode_id = f"check-env:{check}:{uuid.uuid4().hex[:12]}"
    return env


def _as_any_episode(text: str, env: Env) -> str:
    """`text` (JSON) with the episode's id as ``${episode_id}``: runs that differ only in the
    id they were given (a server that echoes its key) are the same run."""
    return text.replace(str(env.episode_id), "${episode_id}")


async def _reset_determinism(factory: Callable[[], Env], renderer: Any, seed: int) -> str | None:
    task = factory().sample_tasks(1, seed=seed)[0]
    seen = []
    for _ in range(3):
        env = _own_episode(factory(), "reset")
        try:
            messages = await env.reset(task, seed)
        finally:
            await env.close()
        messages = json.loads(_as_any_episode(json.dumps(messages), env))
        tokens = renderer.start(messages, env.tool_schemas()).token_ids if renderer else None
        seen.append((json.dumps(messages, sort_keys=True), tokens))
    if any(s != seen[0] for s in seen[1:]):
        return f"reset(task {task['id']!r}, seed {seed}) gave different observations"
    return None


async def _run_script(factory: Callable[[], Env], task: dict[str, Any], seed: int) -> str:
    env = _own_episode(factory(), "step")
    out = []
    try:
        await env.reset(task, seed)
        for action in env.check_script(task):
            r = await env.step(action)
            calls = [
                {k: v for k, v in c.to_record().items() if k != "observation"} for c in r.calls
            ]
            for c in calls:
                c["result"].pop("latency_ms")
            out.append((r.messages, r.terminated, r.truncated, calls, r.evidence_gain))
            if r.terminated or r.truncated:
                break
    finally:
        await env.close()
    # strict: episodes must be JSON to be written
    return _as_any_episode(json.dumps(out, sort_keys=True), env)


async def _step_determinism(factory: Callable[[], Env], renderer: Any, seed: int) -> str | None:
    task = factory().sample_tasks(1, seed=seed)[0]
    first = await _run_script(factory, task, seed)
    second = await _run_script(factory, task, seed)
    if first != second:
        return f"the scripted actions on task {task['id']!r} gave different results twice"
    return None


async def _dry_runs(factory: Callable[[], Env], renderer: Any, seed: int) -> str | None:
    env = factory()
    writes = [t for t in env.tools if t.effect == "write"]
    if not writes:
        return None
    no_dry = [t.name for t in writes if not t.has_dry_run]
    if no_dry:  # a live replay, or a run with the guard on, would refuse them
        return f"write tools without a dry-run path: {no_dry}"
    unguarded = env.side_effect_guard != "dry_run"
    if unguarded:  # the other checks ran it as configured; dry runs need the guard on
        guarded = _guarded(factory)
        if guarded is None:
            return _NOTE + (
                f"skipped: the environment runs with side_effect_guard="
                f"{env.side_effect_guard!r} (writes are not simulated) and no copy of it "
                "with the guard on can be built here; check it with side_effect_guard="
                "'dry_run' to check its dry-run paths"
            )
        factory, env = guarded
        writes = [t for t in env.tools if t.effect == "write"]
    problem = await _dry_run_checks(factory, env, writes, seed)
    if problem or not unguarded:
        return problem
    return _NOTE + (
        "run on a copy with side_effect_guard='dry_run' (these writes were simulated; the "
        "other checks ran with the guard off, as configured)"
    )


def _guarded(factory: Callable[[], Env]) -> tuple[Callable[[], Env], Env] | None:
    """`factory` (an `EnvFactory`: a config's environment, or check-env's) with the guard on
    and no real writes, and one environment it built; None for any other factory, or an
    environment that takes no guard argument."""
    from dataclasses import replace

    from tracerl.envs.registry import EnvFactory

    if not isinstance(factory, EnvFactory):
        return None
    twin = replace(
        factory, kwargs={**factory.kwargs, "side_effect_guard": "dry_run"}, real_writes=False
    )
    try:
        env = twin()
    except TypeError:  # its __init__ takes no side_effect_guard
        return None
    return (twin, env) if env.side_effect_guard == "dry_run" else None


async def _dry_run_checks(
    factory: Callable[[], Env], env: Env, writes: list[Any], seed: int
) -> str | None:
    """Every write tool completes a dry run (the script's, or a probe of an MCP tool's), and
    no dry run changes the env's real state."""
    exercised: set[str] = set()
    for task in env.sample_tasks(8, seed=seed):
        probe = _own_episode(factory(), "dry-run")
        try:
            problem = await _dry_run_script(probe, task, seed, exercised)
        finally:
            await probe.close()
        if problem:
            return problem
    missing = sorted({t.name for t in writes} - exercised)
    if missing and getattr(env, "toolboxes", None):  # MCP tools: probe their dry-run paths
        from tracerl.envs.mcp.check import probe_dry_runs

        probe = _own_episode(factory(), "dry-run")
        try:
            await probe.reset(env.sample_tasks(1, seed=seed)[0], seed)
            ran, problem = await probe_dry_runs(probe, missing)
        finally:
            await probe.close()
        if problem:
            return problem
        missing = sorted(set(missing) - ran)
    if missing:
        return f"check_script never completed a dry run of {missing} on 8 tasks"
    return None


async def _dry_run_script(
    probe: Env, task: dict[str, Any], seed: int, exercised: set[str]
) -> str | None:
    before = json.dumps(probe.snapshot(), sort_keys=True, default=str)
    await probe.reset(task, seed)
    for action in probe.check_script(task):
        r = await probe.step(action)
        for c in r.calls:
            if c.effect == "write" and c.result.ok:
                if not c.result.dry_run or c.result.effect is None:
                    return f"{c.call.name}: a guarded write must run dry and report its effect"
                exercised.add(c.call.name)
        if r.terminated or r.truncated:
            break
    after = json.dumps(probe.snapshot(), sort_keys=True, default=str)
    if before != after:
        return f"a dry run changed the env's real state on task {task['id']!r}"
    return None


async def _mcp_servers(factory: Callable[[], Env], renderer: Any, seed: int) -> str | None:
    from tracerl.envs.mcp.check import check_servers

    return await check_servers(factory, seed)


async def _splits(factory: Callable[[], Env], renderer: Any, seed: int) -> str | None:
    env = factory()
    declared = env.splits
    if declared is None:
        env.sample_tasks(1, seed=seed)
        return _NOTE + "undeclared (declare `splits` so configs naming a split are checked)"
    if not declared:
        return "the environment declares no splits: it has no tasks to train or evaluate on"
    owner: dict[str, str] = {}
    for split in declared:
        tasks = env.sample_tasks(8, seed=seed, split=split)
        if not tasks:
            return f"split {split!r} sampled no tasks"
        again = factory().sample_tasks(8, seed=seed, split=split)
        if json.dumps(tasks, sort_keys=True) != json.dumps(again, sort_keys=True):
            return f"split {split!r}: the same seed sampled different tasks"
        for t in tasks:
            if not isinstance(t, dict) or not t.get("id"):
                return f"split {split!r}: a task is a dict with an 'id', got {t!r:.80}"
            if owner.setdefault(str(t["id"]), split) != split:
                return f"task {t['id']!r} is in splits {owner[str(t['id'])]!r} and {split!r}"
    return _NOTE + ", ".join(declared)


def _reward_check(scripted_episodes: ScriptedEpisodes) -> Callable[..., Awaitable[str | None]]:
    async def _reward(factory: Callable[[], Env], renderer: Any, seed: int) -> str | None:
        from tracerl.rewards.resolve import env_has_reward, resolve_reward

        env = factory()
        if not env_has_reward(env):
            return _NOTE + "none of its own (a run must name one: trainer.reward)"
        reward = resolve_reward(None, None, env)
        tasks = env.sample_tasks(2, seed=seed, split=(env.splits or ("train",))[0])
        results = await scripted_episodes(factory, env, tasks, renderer, seed)
        scores = [reward(e) for e in results]
        crashed = [s.error for s in scores if s.error]
        if crashed:
            return f"the reward crashed on the scripted actions: {crashed[0]}"
        wins = sum(s.succeeded for s in scores)
        undecided = [c for s in scores for c in s.components if not (c.decided or c.gated)]
        if not wins and undecided:  # say why the reward could not decide
            why = undecided[0].evidence.get("why") or "it gave no reason"
            return (
                f"the env's own reward leaves scripted episodes undecided, never trained on "
                f"({undecided[0].name}: {why})" + _simulated(env, tasks)
            )
        if not wins:
            detail = ", ".join(
                f"{c.name}={c.value:.2f}" for c in scores[0].components if not c.gated
            )
            return (
                f"the env's own reward counts none of {len(tasks)} scripted episodes "
                f"(check_script) a success ({detail}): is the verifier or the script wrong?"
                + _simulated(env, tasks)
            )
        return _NOTE + f"{', '.join(reward.component_names)}; scripted episodes {wins}/{len(tasks)}"

    return _reward


def _simulated(env: Env, tasks: list[dict[str, Any]]) -> str:
    """What a failed reward check must say when the scripted episodes' writes were dry runs
    (a reward that reads what they changed found nothing); "" when they ran for real."""
    if not any(t.effect == "write" for t in env.tools):
        return ""
    allowed = getattr(env, "allow_real_writes", False) or all(
        t.get("allow_real_writes") for t in tasks
    )
    if env.side_effect_guard == "off" and allowed:
        return ""
    return (
        f" (its writes ran simulated, as dry runs: side_effect_guard "
        f"{env.side_effect_guard!r}; a reward that reads what they changed needs "
        "env.side_effect_guard: off and env.allow_real_writes: true)"
    )
