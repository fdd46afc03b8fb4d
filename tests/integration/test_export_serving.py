"""An export served by others sees the prompts its run trained on: plain transformers'
``apply_chat_template(messages, tools=...)`` on the folder, `load("hf:...")`'s renderer and a
vLLM server on the folder (``/tokenize`` with ``tools``) give the run's own prompt ids for its
held-out episodes, and the folder's weights their recorded log-probs; the vLLM engine of a
run on ``model.spec: hf:OUT`` serves the folder itself and samples what its weights say; its
``generation_config.json`` stops where the run stopped; its model card says what the run
was; its vLLM tool-parser plugin reads the calls the model writes.

The run: one GRPO step of a tiny random model with SmolLM2's tokenizer (a template that does
not render tools: the renderer writes them) on the search environment's tools."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import httpx
import pytest
import torch

from tracerl.config import RunConfig
from tracerl.config.loading import load_config
from tracerl.engines import open_engine
from tracerl.envs.parsers import get_parser
from tracerl.models import load
from tracerl.rollout.persist import read_step_file
from tracerl.rollout.runner import Policy
from tracerl.rollout.sampler import SampleRequest
from tracerl.train.export import export_run
from tracerl.train.logprobs import token_logprobs
from tracerl.train.loop import train
from tracerl.types import Source

RUN = [
    "env.name=search",
    "env.kwargs={corpus: synthetic}",
    "env.tasks_per_step=2",
    "env.eval_tasks=3",
    "trainer.steps=1",
    "trainer.group_size=2",
    "trainer.checkpoint_every=1",
    "rollout.budgets.steps=2",
    "rollout.max_turn_tokens=12",
    "rollout.reserve=null",
]


def _trained_export(tmp: Path, spec: str) -> tuple[Path, Path, object]:
    (tmp / "c.yaml").write_text("name: ex\n")
    cfg = load_config(tmp / "c.yaml", [f"out_dir={tmp / 'runs'}", f"model.spec={spec}", *RUN])
    train(cfg, log=lambda _: None)
    out = tmp / "exported"
    export_run(cfg.run_dir, out)
    return cfg.run_dir, out, cfg


def _held_out(run: Path) -> list:
    """The evaluation of the exported checkpoint (step 0: the evaluation after it, 1)."""
    (path,) = (run / "eval" / "episodes").glob("step_1.jsonl*")
    return list(read_step_file(path))


def _start(t) -> tuple[list[dict], list[dict] | None, list[int]]:
    """An episode's first messages and tools, and the prompt ids the run rendered them to
    (every token before the policy's first)."""
    r = t.receipt
    tools = [{k: v for k, v in s.items() if k != "x-effect"} for s in r["tool_schemas"]]
    ids: list[int] = []
    for s in t.segments:
        if s.source is Source.POLICY:
            break
        ids += s.token_ids
    return r["reset_messages"], (tools if r["tools_in_prompt"] else None), ids


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return _trained_export(tmp_path_factory.mktemp("export"), "tiny-random")


def test_transformers_renders_the_runs_prompts_and_gives_its_logprobs(exported):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run, out, cfg = exported
    tokenizer = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    renderer = load(f"hf:{out}").renderer
    episodes = _held_out(run)
    assert episodes and all(_start(t)[1] for t in episodes)  # the prompts hold tools
    gap = 0.0
    for t in episodes:
        messages, tools, want = _start(t)
        got = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True)
        got = got["input_ids"] if hasattr(got, "keys") else got
        assert list(got) == want
        assert renderer.start(messages, tools).token_ids == want
        base = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        assert len(base["input_ids"] if hasattr(base, "keys") else base) < len(want)  # tools
        x = torch.tensor([t.token_ids])
        with torch.no_grad():
            lps = token_logprobs(model, x, torch.ones_like(x), temperature=cfg.model.temperature)
        gap = max(
            [gap, *(abs(float(lps[0, i]) - lp) for i, lp in enumerate(t.logprobs) if lp != 0.0)]
        )
    assert gap < 1e-3, gap


def test_the_folder_says_how_the_run_sampled_and_what_it_was(exported):
    from transformers import GenerationConfig

    run, out, cfg = exported
    receipt = json.loads((out / "tracerl_export.json").read_text())
    stops = sorted(load("tiny-random").renderer.stop_token_ids)
    assert receipt["stop_token_ids"] == stops and receipt["parser"] == "json_list"
    assert receipt["vllm_tool_parser"] == "tracerl_json_list"
    gen = GenerationConfig.from_pretrained(out)
    assert list(gen.eos_token_id) == stops and gen.do_sample
    assert gen.temperature == cfg.model.temperature and gen.top_p == 1.0
    assert gen.max_new_tokens == 12 and gen.pad_token_id is not None
    card = (out / "README.md").read_text()
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    (after,) = [m for m in metrics if m.get("step") == 1 and "eval/heldout/success_rate" in m]
    rate = after["eval/heldout/success_rate"]
    assert f"| this checkpoint | `heldout` | {rate:.3f} | 3 |" in card
    assert "| baseline (before training) | `heldout` |" in card
    for fact in ("`tiny-random`", "`search`", '`{"corpus": "synthetic"}`', "`0.1.0`"):
        assert fact in card
    assert "apply_chat_template(\n    messages, tools=tools" in card
    assert f"--tool-parser-plugin {out}/tracerl_tool_parser.py" in card
    assert (run / "config.yaml").read_text().strip() in card
    assert (out / "tracerl_tool_parser.py").exists()


# ---- vLLM ------------------------------------------------------------------------------


PLUGIN_CHECK = """
import json, sys
sys.path.insert(0, sys.argv[1])
import tracerl_tool_parser as p
from vllm.tool_parsers.abstract_tool_parser import ToolParserManager
from transformers import AutoTokenizer
cls = ToolParserManager.get_tool_parser("tracerl_json_list")
parser = cls(AutoTokenizer.from_pretrained(sys.argv[1]))
out = {}
for name, text in json.loads(sys.argv[2]).items():
    got = parser.extract_tool_calls(text, None)
    out[name] = [got.tools_called, got.content,
                 [[c.function.name, json.loads(c.function.arguments)] for c in got.tool_calls]]
streamed, text = [], json.loads(sys.argv[2])["calls"]
s = cls(AutoTokenizer.from_pretrained(sys.argv[1]))
for i in range(1, len(text) + 1):
    d = s.extract_tool_calls_streaming(text[:i-1], text[:i], text[i-1], [], [], [], None)
    if d is not None:
        calls = [[c.function.name, c.function.arguments] for c in d.tool_calls]
        streamed.append([d.content, calls])
out["streamed"] = streamed
print(json.dumps(out))
"""


@pytest.mark.slow
def test_vllm_serves_the_runs_prompts_and_its_plugin_reads_the_calls(vllm_python, tmp_path):
    run, out, _ = _trained_export(tmp_path, "tiny-random-hd64")  # heads vLLM's CPU runs
    calls = [("search", {"query": "Ada é"}), ("open", {"doc_id": "d1"})]
    call_text = get_parser("json_list").format_calls(calls)
    texts = {
        "calls": "Let me look. " + call_text,
        "answer": "Paris.",
        "broken": "<tool_call>[{'name': 1}]</tool_call>",
    }
    checked = subprocess.run(
        [vllm_python, "-c", PLUGIN_CHECK, str(out), json.dumps(texts)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert checked.returncode == 0, checked.stderr[-3000:]
    got = json.loads(checked.stdout.strip().splitlines()[-1])
    assert got["calls"] == [True, "Let me look.", [list(c) for c in calls]]
    assert got["answer"] == [False, "Paris.", []]
    assert got["broken"] == [False, texts["broken"], []]
    streamed = got["streamed"]
    assert "".join(c for c, _ in streamed if c) == "Let me look. "
    assert [call for _, cs in streamed for call in cs] == [
        [n, json.dumps(a, ensure_ascii=False)] for n, a in calls
    ]

    plugin = [
        "--enable-auto-tool-choice",
        "--tool-parser-plugin",
        str(out / "tracerl_tool_parser.py"),
    ]
    # served as a run serves `model.spec: hf:OUT` with `model.engine: vllm`: the engine
    # hands the server the exported folder itself, which samples what its weights say
    vllm = {
        "python": vllm_python,
        "kv_cache_gb": 0.25,
        "max_model_len": 1024,
        "executor": "uni",
        "extra_args": ["--enforce-eager", *plugin, "--tool-call-parser", "tracerl_json_list"],
    }
    served = RunConfig(model={"spec": f"hf:{out}", "engine": "vllm", "vllm": vllm})
    exported = load(f"hf:{out}")
    policy = Policy.from_bundle(exported, None, get_parser("json_list"))
    base = load("tiny-random-hd64")
    with open_engine(served, exported, policy, tmp_path / "serve", log=lambda _: None) as e:
        request = SampleRequest((1, 42, 7, 99, 5), 8, frozenset(), seed=3)
        answer = asyncio.run(e.sampler.sample(request))
        _tokenizes_as_the_run(e.url, e.name, run, calls, call_text, base)
    assert str(out) in (tmp_path / "serve" / "engine" / "vllm.log").read_text()  # not a copy
    ids = torch.tensor([[*request.prompt_ids, *answer.token_ids]])
    with torch.no_grad():
        mine = token_logprobs(exported.model, ids, torch.ones_like(ids), temperature=1.0)
    mine = mine[0, len(request.prompt_ids) :].tolist()
    assert answer.token_ids  # a bf16 server, fp32 here
    assert max(abs(x - y) for x, y in zip(answer.logprobs, mine, strict=True)) < 0.05


def _tokenizes_as_the_run(url, name, run, calls, call_text, base) -> None:
    """The server's ``/tokenize`` of each held-out episode's start (its tools in the chat
    template) is the run's prompt, and a turn with calls sent back as OpenAI ``tool_calls``
    renders as the run rendered it."""
    for t in _held_out(run):
        messages, tools, want = _start(t)
        body = {
            "model": name,
            "messages": messages,
            "tools": tools,
            "add_generation_prompt": True,
        }
        r = httpx.post(f"{url}/tokenize", json=body, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["tokens"] == want
        # a turn with calls, sent back as OpenAI tool_calls, renders as the run's would
        reply = {"role": "assistant", "content": "", "tool_calls": [
            {"id": f"c{i}", "type": "function",
             "function": {"name": n, "arguments": json.dumps(a)}}
            for i, (n, a) in enumerate(calls)
        ]}  # fmt: skip
        result = {"role": "tool", "tool_call_id": "c0", "content": "found"}
        body["messages"] = [*messages, reply, result]
        r = httpx.post(f"{url}/tokenize", json=body, timeout=60)
        ran = [*messages, {"role": "assistant", "content": call_text}, result]
        text = base.renderer.render_text(ran, tools, add_generation_prompt=True)
        assert r.json()["tokens"] == base.tokenizer(text, add_special_tokens=False)["input_ids"]
