"""The newcomer's path, measured: a task of one's own (`tracerl init`), trained, exported under
a name of one's choosing, then served with its tools in plain transformers and in vLLM; the
served held-out success against `tracerl eval` of the run, all greedy, episode by episode.

    python benchmarks/newcomer_path.py                       # SmolLM2: init, train, the rest
    python benchmarks/newcomer_path.py --project DIR         # an init'ed project, trained
    python benchmarks/newcomer_path.py --model tiny-random-hd64 --fast   # the test's path

Prints, per way of serving: held-out success (and its standard error), how many episodes
gave every turn the run's own prompt ids, and how many wrote the run's own text in every
turn. `tests/integration/test_newcomer_path.py` runs this path on a tiny model.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TRACERL = shutil.which("tracerl", path=str(Path(sys.executable).parent)) or "tracerl"
NAME = "unitconv"
FAST = [  # a tiny model's training, cut to a smoke test (the test's path)
    "warm_start=null",
    "trainer.steps=1",
    "trainer.group_size=2",
    "env.tasks_per_step=2",
    "trainer.checkpoint_every=1",
    "rollout.max_turn_tokens=24",
]


def serving() -> Any:
    """examples/serve_export.py, the code a user would write to serve an export."""
    spec = importlib.util.spec_from_file_location("serve_export", ROOT / "examples/serve_export.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["serve_export"] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def tracerl(cwd: Path, *args: str, timeout: float = 3600) -> str:
    t0 = time.perf_counter()
    done = subprocess.run(
        [TRACERL, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=os.environ
    )
    if done.returncode != 0:
        raise RuntimeError(f"tracerl {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    print(f"  tracerl {' '.join(args)}: {time.perf_counter() - t0:.0f} s", flush=True)
    return done.stdout


def prepare(workdir: Path, model: str, extra: list[str]) -> Path:
    """init -> train -> export (as `my-policy`, a name with no model family in it)."""
    project = workdir / NAME
    if not project.exists():
        tracerl(workdir, "init", NAME)
    if not (project / "runs" / NAME / "checkpoints").is_dir():
        tracerl(project, "train", f"configs/{NAME}.yaml", f"model.spec={model}", *extra)
    if not (project / "my-policy").is_dir():
        tracerl(project, "export", f"runs/{NAME}", "--out", "my-policy")
    return project


def evaluate(project: Path, extra: list[str]) -> dict[str, float]:
    """`tracerl eval` of the run (its newest checkpoint), greedy; its metrics."""
    out = project / "runs" / "eval-greedy"
    if not (out / "metrics.jsonl").is_file():
        spec = f"model.spec=run:runs/{NAME}"
        tracerl(
            project, "eval", f"configs/{NAME}.yaml", spec, "eval.temperature=0", *extra,
            "--out", str(out),
        )  # fmt: skip
    (row,) = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return row


def importable(project: Path) -> None:
    """The init'ed package (`unitconv`) imports, as it does from the project's folder."""
    if str(project) not in sys.path:
        sys.path.insert(0, str(project))


def held_out(project: Path, extra: list[str]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The tasks `tracerl eval` played (its config's eval split, count and seed), and its
    episodes by task id."""
    import yaml

    from tracerl.rollout.persist import read_run_trajectories

    cfg = yaml.safe_load((project / "runs" / "eval-greedy" / "config.yaml").read_text())
    env = cfg["env"]
    importable(project)
    from tracerl.envs import make

    tasks = make(env["name"]).sample_tasks(
        env["eval_tasks"], seed=cfg["trainer"]["seed"], split=env["eval_split"]
    )
    episodes = {
        t.receipt["task"]["id"]: t
        for _, t in read_run_trajectories(project / "runs" / "eval-greedy" / "eval")
    }
    return tasks, {"config": cfg, "episodes": episodes}


def same_turn(served: Any, run: Any, step: int, parser: Any) -> bool:
    """Did the served turn write what the run's did: the same calls (a server hands them
    over parsed, its text without them), or the same answer text?"""
    calls = [(c.name, c.arguments) for c in parser.parse(run.text, step=step).tool_calls]
    if calls or served.calls:
        return calls == [(c["name"], c["arguments"]) for c in served.calls]
    return served.text.strip() == run.text.strip()


def compare(project: Path, played: list[Any], ran: dict[str, Any], tokenizer: Any) -> dict:
    """Served episodes against the run's: success (the project's own verifier), and the
    episodes whose every turn had the run's prompt ids / wrote the run's calls and text."""
    from tracerl.envs.parsers import get_parser

    importable(project)
    rewards = importlib.import_module(f"{NAME}.rewards")
    serve = sys.modules["serve_export"]
    meta = json.loads((project / "my-policy" / "tracerl_export.json").read_text())
    stop = set(meta["stop_token_ids"])
    parser = get_parser(meta["parser"])
    wins, same_ids, same_text, first_diff = [], 0, 0, None
    gaps: list[float] = []  # served minus recorded log-prob, per written token
    for p in played:
        task = ran["episodes"][p.task_id].receipt["task"]
        ok = p.answer is not None and rewards.within_tolerance(p.answer, task["expected"])[0] >= 1
        wins.append(float(ok))
        theirs = serve.run_turns(
            ran["episodes"][p.task_id],
            stop,
            lambda ids: tokenizer.decode(ids, skip_special_tokens=False),
        )
        ids_equal = len(theirs) == len(p.turns) and all(
            a.prompt_ids == b.prompt_ids for a, b in zip(p.turns, theirs, strict=False)
        )
        text_equal = len(theirs) == len(p.turns) and all(
            same_turn(a, b, step, parser)
            for step, (a, b) in enumerate(zip(p.turns, theirs, strict=False))
        )
        for a, b in zip(p.turns, theirs, strict=False):
            gaps += [abs(x - y) for x, y in zip(a.logprobs or (), b.logprobs or (), strict=False)]
        same_ids += ids_equal
        same_text += text_equal
        if first_diff is None and not (ids_equal and text_equal):
            first_diff = {
                "task": p.task_id,
                "served": [t.text for t in p.turns],
                "run": [t.text for t in theirs],
            }
    n = len(wins)
    rate = sum(wins) / n
    stderr = math.sqrt(sum((w - rate) ** 2 for w in wins) / (n - 1) / n) if n > 1 else 0.0
    return {
        "episodes": n,
        "success_rate": rate,
        "success_rate_stderr": stderr,
        "same_prompt_ids": same_ids,
        "same_text": same_text,
        "first_difference": first_diff,
        "logprob_gap_max": max(gaps, default=float("nan")),
        "logprob_tokens": len(gaps),
    }


def play(project: Path, tasks: list, ran: dict, chat: Any, tokenizer: Any, **kw: Any) -> dict:
    """The held-out `tasks` played through `chat` as the run's episodes went (its budgets
    and reserve: the model card's protocol), compared with the run's own (`compare`)."""
    from tracerl.envs import make

    rollout = ran["config"]["rollout"]
    reserve = rollout.get("reserve") or {}
    importable(project)
    played = sys.modules["serve_export"].play_all(
        lambda: make(ran["config"]["env"]["name"]),
        tasks,
        chat,
        steps=rollout["budgets"]["steps"],
        tool_calls=rollout["budgets"].get("tool_calls"),
        finalize_at=reserve.get("min_steps_for_finalize"),
        instruction=reserve.get("instruction"),
        **kw,
    )
    return compare(project, played, ran, tokenizer)


def serve_transformers(project: Path, tasks: list, ran: dict) -> dict:
    chat = serving().TransformersChat(project / "my-policy")
    return play(project, tasks, ran, chat, chat.tokenizer)


def serve_vllm(project: Path, tasks: list, ran: dict, log: Path) -> dict:
    """`vllm serve my-policy` with the export's tool parser, fp32 (greedy as the run's
    fp32 eval), through its OpenAI-compatible chat endpoint."""
    from transformers import AutoTokenizer

    from tracerl.engines.vllm import ServerSettings, VLLMServer
    from tracerl.engines.vllm_python import find_vllm_python

    serve = serving()
    folder = project / "my-policy"
    meta = json.loads((folder / "tracerl_export.json").read_text())
    plugin = ["--tool-parser-plugin", str(folder / meta["vllm_tool_parser_plugin"])]
    settings = ServerSettings(
        python=find_vllm_python(),
        dtype="float32",
        kv_cache_gb=0.5,
        max_model_len=2048,
        executor="uni",
        extra_args=(
            "--enforce-eager",
            "--enable-auto-tool-choice",
            *plugin,
            "--tool-call-parser",
            meta["vllm_tool_parser"],
        ),
    )
    server = VLLMServer(folder, "my-policy", settings, log)
    url = server.start()
    try:
        turn = ran["config"]["rollout"]["max_turn_tokens"]
        chat = serve.ServerChat(f"{url}/v1", "my-policy", max_tokens=turn)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        return play(project, tasks, ran, chat, tokenizer, assistant_calls=True)
    finally:
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--workdir", type=Path, default=ROOT / "runs" / "newcomer")
    ap.add_argument("--project", type=Path, help="an init'ed, trained, exported project")
    ap.add_argument("--fast", action="store_true", help="the smoke-test training (FAST)")
    ap.add_argument("--no-vllm", action="store_true")
    args = ap.parse_args()

    args.workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    project = args.project or prepare(args.workdir, args.model, FAST if args.fast else [])
    row = evaluate(project, [])
    tasks, ran = held_out(project, [])
    split = ran["config"]["env"]["eval_split"]
    print(
        f"tracerl eval run:runs/{NAME} (greedy): {split} success "
        f"{row[f'eval/{split}/success_rate']:.3f} ± {row[f'eval/{split}/success_rate_stderr']:.3f}"
        f" on {len(tasks)} tasks"
    )
    results = {"transformers": serve_transformers(project, tasks, ran)}
    if not args.no_vllm:
        results["vllm"] = serve_vllm(project, tasks, ran, project / "vllm.log")
    for how, r in results.items():
        print(
            f"served by {how:12s}: success {r['success_rate']:.3f} ± "
            f"{r['success_rate_stderr']:.3f}; every turn's prompt ids the run's: "
            f"{r['same_prompt_ids']}/{r['episodes']}; every turn's calls and text the run's: "
            f"{r['same_text']}/{r['episodes']}; log-probs of {r['logprob_tokens']} written "
            f"tokens within {r['logprob_gap_max']:.1e} of the run's"
        )
        if r["first_difference"]:
            print(f"  first difference: {json.dumps(r['first_difference'])[:600]}")
    print(f"total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
