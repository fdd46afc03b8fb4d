"""What an export says about itself: its generation defaults and its model card.

* ``generation_config.json``: the run's sampling: the turn-end stop ids the renderer stops
  on (``eos_token_id``, a list), ``pad_token_id``, ``do_sample``, the run's
  ``model.temperature``, ``top_p`` 1.0 and the run's ``rollout.max_turn_tokens`` as
  ``max_new_tokens``.
* ``README.md``: the base model, the task (environment and its kwargs), the held-out results
  of the exported checkpoint (the run's evaluation after that step, each split's success rate
  with its episodes and a 95% Wilson interval; the baseline beside it), the run's config,
  tracerl's version, the tool-call format and how to serve it with transformers and vLLM.

The vLLM tool-call parser per format: ``hermes`` is vLLM's own; ``json_list`` is
`tracerl.engines.vllm_tool_parser`, copied into the folder as a ``--tool-parser-plugin``.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from pathlib import Path
from typing import Any

import yaml

PLUGIN_FILE = "tracerl_tool_parser.py"
"""The vLLM tool-parser plugin a ``json_list`` export carries."""

VLLM_PARSERS = {"hermes": "hermes", "json_list": "tracerl_json_list"}
"""vLLM's ``--tool-call-parser`` for each tool-call format (json_list: the plugin's)."""


def plugin_source() -> str:
    """The text of the vLLM tool-parser plugin (`tracerl.engines.vllm_tool_parser`), read as
    a file: tracerl never imports it (it imports vLLM)."""
    return (Path(__file__).parents[1] / "engines" / "vllm_tool_parser.py").read_text()


def run_config(run: Path) -> tuple[str, dict[str, Any]]:
    """The run's ``config.yaml``: its text and its values ({} when it does not read)."""
    try:
        text = (run / "config.yaml").read_text()
    except OSError:
        return "", {}
    try:
        values = yaml.safe_load(text)
    except yaml.YAMLError:
        values = None
    return text, values if isinstance(values, dict) else {}


def _section(cfg: dict[str, Any], key: str) -> dict[str, Any]:
    value = cfg.get(key)
    return value if isinstance(value, dict) else {}


def generation_config(
    base: dict[str, Any], stop_ids: list[int], pad_id: int | None, cfg: dict[str, Any]
) -> dict[str, Any]:
    """`base` (what ``save_pretrained`` wrote) with the run's stop ids and sampling."""
    out = {**base, "eos_token_id": stop_ids, "do_sample": True, "top_p": 1.0}
    out["pad_token_id"] = pad_id if pad_id is not None else stop_ids[0]
    temperature = _section(cfg, "model").get("temperature")
    out["temperature"] = float(temperature) if isinstance(temperature, int | float) else 1.0
    max_tokens = _section(cfg, "rollout").get("max_turn_tokens")
    if isinstance(max_tokens, int) and not isinstance(max_tokens, bool):
        out["max_new_tokens"] = max_tokens
    return out


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a rate `successes / n` (95% for z = 1.96).

    ``(p + z²/2n ± z·sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n)``, with ``p = successes / n``
    (Wilson 1927; Brown, Cai & DasGupta 2001 on why not the normal interval)."""
    if n <= 0:
        return 0.0, 1.0
    p, z2 = successes / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


_RATE = re.compile(r"^eval/([^/]+)/success_rate$")
UNDECIDED = ("undecided_rate", "evaluator_error_rate")
"""The shares of an evaluation's episodes its success rate leaves out (nothing decided)."""


def evaluations(
    run: Path, step: int
) -> tuple[dict[str, Any] | None, dict[str, Any] | None, dict[str, Any] | None]:
    """The run's evaluation of checkpoint `step` (the one logged after that step: ``step +
    1`` in ``metrics.jsonl``), its baseline evaluation and its evaluation after the warm
    start; None where the run has none."""
    after = baseline = warm = None
    try:
        lines = (run / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return None, None, None
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if not isinstance(row, dict) or not any(_RATE.match(k) for k in row):
            continue
        if row.get("stage") == "baseline":
            baseline = row
        elif row.get("stage") == "warm_start":
            warm = row
        elif row.get("step") == step + 1:
            after = row
    return after, baseline, warm


def results(row: dict[str, Any]) -> list[tuple[str, float, int, float, float]]:
    """Per split of an evaluation row: (split, success rate, episodes, Wilson low, high)."""
    out = []
    for key in sorted(row):
        m = _RATE.match(key)
        if not m:
            continue
        rate, n = float(row[key]), int(row.get(f"eval/{m[1]}/episodes", 0))
        # the rate is over the episodes whose reward decided: so is its interval
        left_out = sum(float(row.get(f"eval/{m[1]}/{k}", 0.0)) for k in UNDECIDED)
        n = round(n * (1.0 - left_out))
        low, high = wilson(round(rate * n), n)
        out.append((m[1], rate, n, low, high))
    return out


def _fenced(text: str, info: str = "") -> str:
    """`text` as a fenced code block no backtick run inside it can close."""
    longest = max((len(r) for r in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{info}\n{text.rstrip()}\n{fence}"


def _code(text: str) -> str:
    """`text` as inline code (no backtick in it can end the span, no newline can break it)."""
    text = " ".join(str(text).split())
    longest = max((len(r) for r in re.findall(r"`+", text)), default=0)
    tick = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{tick}{pad}{text}{pad}{tick}"


def _cell(text: Any) -> str:
    """`text` as inline code in a table cell (a pipe there would split the row)."""
    return _code(text).replace("|", "\\|")


def _results_table(
    after: dict[str, Any] | None, baseline: dict[str, Any] | None, warm: dict[str, Any] | None
) -> str:
    rows = []
    for label, row in (
        ("this checkpoint", after),
        ("after the warm start (SFT)", warm),
        ("baseline (before training)", baseline),
    ):
        for split, rate, n, low, high in results(row) if row else ():
            rows.append(
                f"| {label} | {_cell(split)} | {rate:.3f} | {n} | [{low:.3f}, {high:.3f}] |"
            )
    if not rows:
        return "The run has no held-out evaluation of this checkpoint.\n"
    note = "" if after else "\nThe run did not evaluate this checkpoint (only its baseline).\n"
    return (
        "| policy | split | success rate | episodes | 95% Wilson interval |\n"
        "|---|---|---|---|---|\n" + "\n".join(rows) + "\n" + note
    )


def _serving(folder: str, parser: str | None) -> str:
    vllm_parser = VLLM_PARSERS.get(parser or "")
    plugin, shell = shlex.quote(f"{folder}/{PLUGIN_FILE}"), shlex.quote(folder)
    if vllm_parser is None:
        flags = ""
        why = (
            f"No vLLM tool-call parser reads the {_code(parser)} format: serve it without one "
            f"and read the turns with `tracerl.envs.parsers.get_parser({parser!r})`.\n"
            if parser
            else "The run names no tool-call format.\n"
        )
    elif parser == "json_list":
        flags = (
            f" \\\n  --enable-auto-tool-choice --tool-parser-plugin {plugin}"
            f" \\\n  --tool-call-parser {vllm_parser}"
        )
        why = (
            "vLLM's `hermes` parser reads one JSON object per `<tool_call>` block, not the "
            f"JSON list this model writes; `{PLUGIN_FILE}` (in this folder, written by "
            "tracerl) registers a parser that does.\n"
        )
    else:
        flags = f" \\\n  --enable-auto-tool-choice --tool-call-parser {vllm_parser}"
        why = ""
    python = (
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
        f"tokenizer = AutoTokenizer.from_pretrained({json.dumps(folder)})\n"
        f"model = AutoModelForCausalLM.from_pretrained({json.dumps(folder)})\n"
        'tools = [{"type": "function", "function": {"name": ..., "description": ...,'
        ' "parameters": {...}}}]\n'
        'messages = [{"role": "user", "content": ...}]\n'
        "ids = tokenizer.apply_chat_template(\n"
        '    messages, tools=tools, add_generation_prompt=True, return_tensors="pt",'
        " return_dict=True\n)\n"
        "out = model.generate(**ids)  # generation_config.json: the run's stop ids, sampling\n"
        "print(tokenizer.decode(out[0, ids['input_ids'].shape[1]:]))"
    )
    return (
        "## How to serve it\n\n"
        "The chat template renders `tools` exactly as the run rendered them in training (and "
        "an assistant message's `tool_calls` in the format the model writes them), so the "
        "prompt is the trained one token for token.\n\n"
        "transformers:\n\n" + _fenced(python, "python") + "\n\n"
        "vLLM (OpenAI-compatible server; pass `tools` in the request):\n\n"
        + _fenced(f"vllm serve {shell}{flags}", "bash")
        + "\n\n"
        + why
    )


def _sampling(cfg: dict[str, Any]) -> str:
    """How the run's evaluations sampled: their temperature and samples per task."""
    evaluation, model = _section(cfg, "eval"), _section(cfg, "model")
    temperature = evaluation.get("temperature")
    if temperature is None:
        temperature = model.get("temperature", 1.0)
    k = evaluation.get("samples_per_task", 1)
    how = "greedy (temperature 0)" if temperature == 0 else f"sampled at temperature {temperature}"
    per = "one episode per task" if k in (None, 1) else f"{k} episodes per task"
    return f"{how}, {per}"


def _protocol(cfg: dict[str, Any]) -> str:
    """The episode the policy trained in: what a served agent does to show it the same
    prompts (`examples/serve_export.py` in tracerl's repository follows it)."""
    rollout = _section(cfg, "rollout")
    budgets = _section(rollout, "budgets")
    lines = [
        "## The episodes it trained in\n",
        "A served agent shows the model the prompts it trained on when it plays the same way:",
        "",
        "- the environment's first messages, with its tools passed as `tools`;",
        "- each call answered by a `tool` message (`tool_call_id`, `name`, the result as "
        "`content`); a turn without a call is the final answer;",
    ]
    if isinstance(budgets.get("steps"), int):
        lines.append(f"- at most {budgets['steps']} model turns per episode")
    if isinstance(budgets.get("tool_calls"), int):
        lines[-1] += f", {budgets['tool_calls']} tool calls"
    if isinstance(rollout.get("max_turn_tokens"), int):
        lines[-1] += f", {rollout['max_turn_tokens']} tokens per turn"
    lines[-1] += ";"
    reserve = _section(rollout, "reserve")
    if reserve.get("instruction"):
        n = reserve.get("min_steps_for_finalize", 1)
        lines.append(
            f"- when a tool step leaves {n} turn(s) or fewer (or spends the last tool call), "
            "one user turn: " + _code(reserve["instruction"]) + ";"
        )
    lines.append(
        "- a turn whose calls cannot be read is answered by the user turn "
        "`Your last message could not be read (<why>).`"
    )
    return "\n".join(lines) + "\n\n"


def model_card(receipt: dict[str, Any], config_text: str, cfg: dict[str, Any], folder: str) -> str:
    """The export's ``README.md``; `folder`: the export's path, as the commands give it."""
    env = _section(cfg, "env")
    kwargs = env.get("kwargs") if isinstance(env.get("kwargs"), dict) else {}
    run = Path(receipt["run"])
    after, baseline, warm = evaluations(run, int(receipt["step"]))
    facts = [
        ("base model", _cell(receipt["base_model"])),
        ("environment (the task)", _cell(env.get("name", "?"))),
        ("environment kwargs", _cell(json.dumps(kwargs, ensure_ascii=False))),
        ("run", _cell(receipt["run"])),
        ("checkpoint step", f"{receipt['step']} (policy version {receipt['policy_version']})"),
        ("LoRA merged", "yes" if receipt["lora_merged"] else "no"),
        ("tool-call format", _cell(receipt.get("parser"))),
        ("stop token ids", _cell(receipt.get("stop_token_ids"))),
        ("tracerl version", _cell(receipt.get("tracerl_version"))),
    ]
    name = _code(cfg.get("name", run.name))
    return (
        "---\nlibrary_name: transformers\n"
        "tags: [tracerl, reinforcement-learning, tool-use]\n---\n\n"
        f"# {name} (tracerl export)\n\n"
        "A policy trained with tracerl, exported by `tracerl export` with its chat template, "
        "stop tokens and sampling defaults.\n\n"
        "| | |\n|---|---|\n"
        + "\n".join(f"| {k} | {v} |" for k, v in facts)
        + "\n\n## Held-out results\n\n"
        f"Success rate on the run's evaluation split ({_code(env.get('eval_split', '?'))}; "
        f"training draws from {_code(env.get('train_split', '?'))}), evaluated by the run "
        f"itself after the exported step: {_sampling(cfg)}.\n\n"
        + _results_table(after, baseline, warm)
        + "\n"
        + _serving(folder, receipt.get("parser"))
        + "\n"
        + _protocol(cfg)
        + "\n## The run's config\n\n"
        + _fenced(config_text or "# (the run's config.yaml could not be read)", "yaml")
        + "\n"
    )
