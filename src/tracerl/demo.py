"""`make demo`: the rollout engine end to end, on the real model.

Two agents handle refund requests in the `refund_desk` environment, wrapped in a
`FaultInjector` that fails 30% of tool steps (timeouts, 5xx, refused connections, truncated
outputs), all episodes running concurrently:

* SmolLM2-135M-Instruct, sampled on the batching sampler (two tasks, groups of four);
* a scripted reference agent that follows the refund rules (the shape SFT data will take),
  one in four of its episodes making a deliberate mistake (calling a tool that does not exist).

What the demo simplifies: an untrained 135M model rarely makes a well-formed tool call, so its
episodes are short; nothing is trained. What it does not simplify: every token is attributed
when it is produced, every failure is classified and attributed (injected faults to the
environment, the mistakes to the policy), writes run as dry runs, every episode has a receipt
with its budget ledger and is on disk as soon as it finishes, and one episode is replayed from
its recording and must come back token for token.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from tracerl.config import RunConfig
from tracerl.envs import FaultInjector
from tracerl.envs.refund_desk import reference_plan
from tracerl.report.progress import RichProgress
from tracerl.report.run import find_episode
from tracerl.report.terminal import print_trajectory
from tracerl.rollout import ScriptedSampler
from tracerl.rollout.activity import ACTIVITY
from tracerl.rollout.budget import Budgets, RolloutConfig
from tracerl.rollout.groups import episode_member, episode_task_id, rollout_metrics, run_groups
from tracerl.rollout.persist import EpisodeWriter, read_run_trajectories, step_file
from tracerl.rollout.replay import replay_exact
from tracerl.rollout.runner import Episode, Policy
from tracerl.rollout.sampler import SampleRequest
from tracerl.train.run import Run

CONFIG = RolloutConfig(budgets=Budgets(steps=5, tool_calls=5), max_turn_tokens=96)
TEMPERATURE = 0.7
DEMO_RUN = RunConfig.model_validate(
    {
        "name": "demo",
        "model": {
            "spec": "smollm2-135m-instruct",
            "temperature": TEMPERATURE,
            "max_batch_size": 16,
        },
        "env": {"name": "refund_desk"},
        "trainer": {"seed": 7},
    }
)
"""The demo's model and environment, built as any run's are (`tracerl.train.run.Run`)."""
MISTAKE = ("cancel_order", {"order_id": "A1001"})
"""The reference agent's deliberate mistake: a call to a tool refund_desk does not have."""


def makes_mistake(member: int) -> bool:
    """Whether the reference agent's group member `member` makes its deliberate mistake."""
    return member % 4 == 1


def reference_policy(bundle: Any, tasks: list[dict[str, Any]]) -> Policy:
    """The scripted reference agent; in members where `makes_mistake`, its second turn is
    `MISTAKE`, a call to a tool that does not exist."""
    policy = Policy.from_bundle(bundle, ScriptedSampler([]))
    parser, by_id = policy.parser, {t["id"]: t for t in tasks}

    def turn(request: SampleRequest) -> str:
        task_id, member = episode_task_id(request.episode_id), episode_member(request.episode_id)
        texts = [
            parser.format_calls(x) if kind == "calls" else parser.format_answer(x)
            for kind, x in reference_plan(by_id[task_id])
        ]
        if makes_mistake(member):
            texts.insert(1, parser.format_calls([MISTAKE]))
        return texts[min(request.turn, len(texts) - 1)]

    policy.sampler = ScriptedSampler.from_texts(bundle.renderer, turn, logprob=-0.1)
    return policy


def _calls(e: Episode) -> list[dict[str, Any]]:
    """Every tool call the episode's steps recorded, retried attempts included."""
    return [c for s in e.steps for a in s.get("attempts", []) for c in a.get("calls", [])]


def episode_header(agent: str, e: Episode, model_id: str) -> str:
    """Who wrote the displayed episode's `policy` turns, and which of its failures were
    deliberate: from the agent that ran it and its recorded calls."""
    if agent == "ref":
        lines = [
            "Its turns were written by the scripted reference agent, not sampled from a model "
            "(coloured `policy`: a script stands where the policy would, as in SFT data)."
        ]
        refused = any(
            c["action"]["tool"] == MISTAKE[0]
            and (c["result"]["error"] or {}).get("kind") == "unknown_tool"
            for c in _calls(e)
        )
        if refused and makes_mistake(episode_member(e.episode_id)):
            lines.append(
                f"Its call to `{MISTAKE[0]}`, a tool that does not exist, is deliberate: the "
                "script makes this mistake in one episode in four, to show a policy fault "
                "beside the injected ones."
            )
    else:
        lines = [f"Its turns were sampled from {model_id} at temperature {TEMPERATURE}."]
    injected = [c["result"]["error"]["kind"] for c in _calls(e) if c.get("infra_error")]
    injected += [s["fault"]["kind"] for s in e.steps if s.get("fault")]
    if injected:
        lines.append(
            f"Tool failures injected by the FaultInjector (the environment's, not the "
            f"policy's): {_counted(injected)}."
        )
    return "\n".join(lines)


def _counted(kinds: list[str]) -> str:
    counts = {k: kinds.count(k) for k in dict.fromkeys(kinds)}
    return ", ".join(k if n == 1 else f"{k} x{n}" for k, n in counts.items())


def _faults(e: Episode) -> str:
    kinds = [c["result"]["error"]["kind"] for c in _calls(e) if c["result"]["error"]]
    kinds += [s["fault"]["kind"] for s in e.steps if s.get("fault")]
    return _counted(kinds) or "-"


def _table(rows: list[tuple[str, Episode]]) -> Table:
    table = Table(title="episodes")
    for col in ("agent", "task/g", "stop reason", "owner", "train"):
        table.add_column(col, no_wrap=True)
    table.add_column("faults (all attempts)", min_width=22)
    for agent, e in rows:
        table.add_row(
            agent,
            f"{e.receipt.task['order_id']}/{episode_member(e.episode_id)}",
            e.stop_reason.value,
            e.attribution.value,
            "yes" if e.gradient_eligible else "no",
            _faults(e),
        )
    return table


def main(out_dir: str = "runs/demo", console: Console | None = None) -> Path:
    console = console or Console()
    console.rule("[bold]tracerl demo: refund_desk under injected faults")
    t0 = time.perf_counter()
    console.print(f"loading {DEMO_RUN.model.spec} ...", highlight=False)
    run = Run.model_only(DEMO_RUN)
    bundle, sampler = run.bundle, run.sampler
    how = "converted from the GGUF and cached" if bundle.origin == "gguf" else "from the cache"
    console.print(f"loaded {bundle.model_id} {how} in {bundle.load_seconds:.1f} s", highlight=False)
    path = step_file(out_dir, 0)
    path.unlink(missing_ok=True)  # a fresh demo run
    writer = EpisodeWriter(out_dir, step=0)
    tasks = run.env().sample_tasks(2, seed=3)

    def env() -> FaultInjector:
        return FaultInjector(run.env(), rate=0.3, seed=1)

    async def both(bars: RichProgress) -> list[list[list[Episode]]]:
        def groups(policy: Policy, seed: int) -> Any:
            return run_groups(
                env,
                tasks,
                policy,
                CONFIG,
                group_size=4,
                seed=seed,
                writer=writer,
                on_episode=bars.advance,
            )

        scripted = reference_policy(bundle, tasks)
        return list(await asyncio.gather(groups(run.policy, 7), groups(scripted, 8)))

    with RichProgress(console, sampled=ACTIVITY.totals) as bars:
        bars.phase("demo episodes", 2 * len(tasks) * 4)
        model_groups, scripted_groups = asyncio.run(both(bars))
    rows = [("model", e) for g in model_groups for e in g]
    rows += [("ref", e) for g in scripted_groups for e in g]
    episodes = [e for _, e in rows]
    agent, longest = max(
        rows, key=lambda r: (r[1].receipt.ledger["used"]["tool_calls"], len(r[1].steps))
    )
    console.rule(f"the busiest episode: {longest.episode_id}")
    console.print(episode_header(agent, longest, bundle.model_id), markup=False)
    print_trajectory(longest.trajectories[-1], console)
    console.print("its budget ledger:")
    console.print_json(json.dumps(longest.receipt.ledger))
    console.print(_table(rows))
    m = rollout_metrics(episodes)
    console.print({k: round(v, 3) for k, v in m.items() if v and "/" in k})
    written = {t.episode_id for _, t in read_run_trajectories(out_dir)}
    report = asyncio.run(
        replay_exact(
            find_episode(out_dir, longest.episode_id).trajectories, renderer=bundle.renderer
        )
    )
    console.rule("summary")
    console.print(
        f"{len(episodes)} episodes started, {len(written)} on disk in {path}; model sampler: "
        f"{sampler.stats.batches} batches (largest {sampler.stats.max_batch}); replay of "
        f"{longest.episode_id}: {'exact' if report.ok else report.first_difference}; "
        f"total {time.perf_counter() - t0:.1f} s"
    )
    if len(written) != len(episodes) or not report.ok:
        raise SystemExit("the demo lost an episode or could not replay one")
    console.print(f"try: tracerl replay {out_dir} '{longest.episode_id}' [--live]")
    return path
