"""A small but real run directory for the report's tests, written in seconds.

The trainer's own pieces write it (grpo_step with a learner on the tiny model, the search
env and its reward, run_groups + eval_metrics for evaluations, MetricsLog); only the policy
is scripted, so each group member fails in a known way:

    g0  the oracle: searches the gold subject, answers right          -> succeeded
    g1  answers at once, with a <script> tag in its answer            -> answered_without_evidence
    g2  writes prose the parser cannot read                           -> format
    g3  searches the gold subject, then answers something else        -> ignored_evidence
    g4  the oracle, in an env whose every tool call fails with a 5xx  -> environment
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tracerl.config import EnvConfig, RunConfig, TrainerConfig, dump_config
from tracerl.envs import FaultInjector, get_parser, make
from tracerl.envs.search import oracle_actions
from tracerl.evaluate import task_batches
from tracerl.report.sinks import MetricsLog
from tracerl.rewards import SEARCH_REWARD, RewardContext, RewardSpec, compose
from tracerl.rollout import ScriptedSampler
from tracerl.rollout.budget import Budgets, RetryPolicy, RolloutConfig
from tracerl.rollout.groups import episode_member, episode_task_id, run_groups
from tracerl.rollout.persist import EpisodeWriter
from tracerl.rollout.runner import Policy
from tracerl.train.grpo import GRPOConfig, grpo_step
from tracerl.train.learner import Learner, LearnerConfig
from tracerl.train.metrics import citation_metrics, eval_metrics

INJECTION = "<script>window.__pwned=1</script><img src=x onerror=window.__pwned=2>"
ENV = {"corpus": "synthetic", "protocol": "search_r1"}
ROLLOUT = RolloutConfig(
    budgets=Budgets(steps=3), reserve=None, retry=RetryPolicy(max_retries=1, backoff_s=0.0)
)
MEMBERS = 5
EXPECTED = {
    0: ("succeeded", "succeeded"),
    1: ("policy", "answered_without_evidence"),
    2: ("policy", "format"),
    3: ("policy", "ignored_evidence"),
    4: ("environment", "server_error"),
}


def scripted_policy(tiny: Any, probe: Any, tasks: list[dict[str, Any]]) -> Policy:
    parser = get_parser("search_r1")
    by_id = {t["id"]: t for t in tasks}

    def turn(request: Any) -> str:
        task = by_id[episode_task_id(request.episode_id)]
        g = episode_member(request.episode_id) % MEMBERS
        oracle = []
        for action in oracle_actions(probe.corpus, task):
            call = action.tool_calls[0]
            if call.name == "answer":
                oracle.append(parser.format_answer(call.arguments["text"]))
            else:
                oracle.append(parser.format_calls([(call.name, call.arguments)]))
        script = {
            1: [parser.format_answer(f"{INJECTION} Nowhere")],
            2: ["I am not sure what to do here."],
            3: [oracle[0], parser.format_answer("Nowhere")],
        }.get(g, oracle)
        return script[min(request.turn, len(script) - 1)]

    return Policy(
        ScriptedSampler.from_texts(tiny.renderer, turn), tiny.renderer, parser, "tiny-random"
    )


def build_run(root: Path, tiny: Any, model: Any, steps: int = 2) -> Path:
    cfg = RunConfig(
        name="scripted",
        out_dir=str(root),
        model={"spec": "tiny-random"},
        env=EnvConfig(name="search", kwargs=ENV, parser="search_r1", tasks_per_step=2),
        trainer=TrainerConfig(steps=steps, group_size=MEMBERS),
        rollout=ROLLOUT,
    )
    run = cfg.run_dir
    run.mkdir(parents=True, exist_ok=True)
    (run / "config.yaml").write_text(dump_config(cfg))
    probe = make("search", **ENV)
    spec = RewardSpec.from_yaml(SEARCH_REWARD)

    def reward(e: Any) -> Any:
        return compose(spec, RewardContext.from_trajectories(e.trajectories, probe.document))

    made: list[int] = []

    def env() -> Any:  # members are created in order: every fifth env is down
        made.append(1)
        e = make("search", **ENV)
        if len(made) % MEMBERS == 0:
            return FaultInjector(e, rate=1.0, kinds=["server_error"], seed=0)
        return e

    sink = MetricsLog.open(run)
    learner = Learner(model, LearnerConfig(lr=1e-6))
    train_tasks = probe.sample_tasks(2 * steps, seed=0, split="train")
    eval_tasks = probe.sample_tasks(3, seed=0, split="heldout")
    adv_tasks = probe.sample_tasks(4, seed=0, split="adversarial")
    policy = scripted_policy(tiny, probe, train_tasks + eval_tasks + adv_tasks)
    grpo = GRPOConfig(group_size=MEMBERS, rollout=ROLLOUT)

    def evaluate(step: int, stage: str) -> None:
        row: dict[str, Any] = {"step": step, "phase": "eval", "stage": stage}
        for split, tasks in (("heldout", eval_tasks), ("adversarial", adv_tasks)):
            where = run / "eval" if split == "heldout" else run / "eval" / split
            episodes = []
            for _, batch, factory in task_batches(tasks, lambda: make("search", **ENV), seed=0):
                groups = asyncio.run(
                    run_groups(
                        factory,
                        batch,
                        policy,
                        ROLLOUT,
                        group_size=1,
                        seed=10**6 + step,
                        writer=EpisodeWriter(where, step),
                        score=reward,
                    )
                )
                episodes += [g[0] for g in groups]
            row.update(eval_metrics(episodes, split, probe.document))
        sink.log(row)

    evaluate(0, "baseline")
    for step in range(steps):
        made.clear()
        m, episodes = grpo_step(
            env,
            train_tasks[2 * step : 2 * step + 2],
            policy,
            learner,
            reward,
            grpo,
            step=step,
            writer=EpisodeWriter(run, step),
        )
        m.update({f"train/{k}": v for k, v in citation_metrics(episodes, probe.document).items()})
        m["time/step_s"] = 1.0
        sink.log({"step": step, "phase": "train", **m})
    evaluate(steps, "train")
    sink.close()
    return run
