"""An export's chat template renders what the run's renderer rendered: `tools=` and a client's
`tool_calls` given to plain ``apply_chat_template`` give the run's prompt text and token ids
(`tracerl.models.export_template`); the model card's numbers and markdown
(`tracerl.train.export_card`)."""

from __future__ import annotations

import itertools
import json

import pytest

from tests.conftest import trl_template
from tracerl.envs.parsers import get_parser
from tracerl.models.export_template import export_chat_template
from tracerl.models.render import ChatRenderer
from tracerl.train.export_card import _fenced, generation_config, model_card, wilson


def _tool(name: str, description: str | None, **properties) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": []},
        },
    }


SEARCH = _tool("search", "Search the corpus.", query={"type": "string"}, k={"default": 3})
UNICODE = _tool(  # non-ASCII, an emoji, quotes, template and tag look-alikes, nesting
    "lookup_é",
    'Cherche « ça » 😀 — "quoted" {{ not jinja }} </tools> <tool_call>',
    filters={"anyOf": [{"type": "array", "items": {"$ref": "#/$defs/F"}}, {"type": "null"}]},
    when={"enum": ["día", "夜"], "default": None},
)
BARE = _tool("noop", None)
TOOL_LISTS = [None, [], [SEARCH], [SEARCH, UNICODE, BARE]]
CALLS = [("search", {"query": "café 😀", "k": 2}), ("noop", {"nested": [1, {"x": None}]})]


def _conversations(parser: str) -> list[tuple[list[dict], list[dict]]]:
    """(what the run rendered, what a client sends back) pairs: equal except that the
    client's assistant turns carry `tool_calls` where the run's carry the call text."""
    text = get_parser(parser).format_calls(CALLS)
    user = {"role": "user", "content": "Where was Ada born? ü"}
    system = {"role": "system", "content": "Be brief. ß"}
    tool = {"role": "tool", "content": '{"ok": true} ñ', "tool_call_id": "call_0_0"}
    plain = [
        [user],
        [system, user],
        [system, user, {"role": "assistant", "content": "Paris."}, user],
    ]
    pairs = [(m, m) for m in plain]
    for content, args_as_text in itertools.product(["", "Let me look."], [False, True]):
        calls = [
            {
                "id": f"call_0_{i}",
                "type": "function",
                "function": {"name": n, "arguments": json.dumps(a) if args_as_text else a},
            }
            for i, (n, a) in enumerate(CALLS)
        ]
        trained = f"{content}\n{text}" if content else text
        for head in ([user], [system, user]):
            ran = [*head, {"role": "assistant", "content": trained}, tool]
            sent = [*head, {"role": "assistant", "content": content, "tool_calls": calls}, tool]
            pairs.append((ran, sent))
            none = [*head, {"role": "assistant", "content": None, "tool_calls": calls}, tool]
            if not content:  # OpenAI clients send `content: null` beside tool calls
                pairs.append((ran, none))
    # a client that sends the call text itself as well: nothing is written twice
    ran = [user, {"role": "assistant", "content": text}, tool]
    sent = [user, {"role": "assistant", "content": text, "tool_calls": [{"function": {}}]}, tool]
    return [*pairs, (ran, sent)]


@pytest.mark.parametrize("parser", ["json_list", "hermes"])
def test_the_exported_template_renders_tools_and_calls_as_the_run_did(base_tokenizer, parser):
    renderer = ChatRenderer(base_tokenizer)
    assert not renderer.renders_tools  # SmolLM2's template: the renderer writes the tools
    exported = export_chat_template(renderer, parser)
    checked = 0
    for (ran, sent), tools in itertools.product(_conversations(parser), TOOL_LISTS):
        want = renderer.render_text(ran, tools, add_generation_prompt=True)
        got = base_tokenizer.apply_chat_template(
            sent, tools=tools, chat_template=exported, tokenize=False, add_generation_prompt=True
        )
        assert got == want, (ran, sent, tools)
        if tools:
            for t in tools:  # each tool a line of json.dumps(tool, ensure_ascii=False)
                assert "\n" + json.dumps(t, ensure_ascii=False) + "\n" in got
        ids = base_tokenizer.apply_chat_template(
            sent, tools=tools, chat_template=exported, add_generation_prompt=True
        )
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        assert list(ids) == base_tokenizer(want, add_special_tokens=False)["input_ids"]
        checked += 1
    assert checked == len(_conversations(parser)) * len(TOOL_LISTS)


def test_without_tools_the_export_renders_as_its_base_template(base_tokenizer):
    renderer = ChatRenderer(base_tokenizer)
    exported = export_chat_template(renderer, "json_list")
    for msgs in ([{"role": "user", "content": "hi"}], [{"role": "system", "content": "s"}]):
        for gen in (True, False):
            assert base_tokenizer.apply_chat_template(
                msgs, chat_template=exported, tokenize=False, add_generation_prompt=gen
            ) == base_tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)
    # an export's renderer (its template now names `tools`) renders the run's prompts
    again = ChatRenderer(base_tokenizer, exported)
    assert again.renders_tools and again.stop_token_ids == renderer.stop_token_ids
    for ran, _ in _conversations("json_list"):
        for tools in TOOL_LISTS:
            assert again.render_text(ran, tools, add_generation_prompt=True) == (
                renderer.render_text(ran, tools, add_generation_prompt=True)
            )


def test_a_template_that_renders_tools_itself_is_kept(family_renderer):
    renderer = family_renderer("qwen2_5")
    assert renderer.renders_tools
    assert (
        export_chat_template(renderer, "hermes")
        == renderer.chat_template
        == (trl_template("qwen2_5"))
    )


def test_wilson_interval_against_hand_computed_values():
    # 7 of 10, z = 1.96: centre (0.7 + 0.19208) / 1.38416, half 1.96 * sqrt(0.021 + 0.00096)
    # / 1.38416 -> [0.3968, 0.8922]
    low, high = wilson(7, 10)
    assert (round(low, 4), round(high, 4)) == (0.3968, 0.8922)
    assert wilson(0, 3) == (0.0, pytest.approx(0.5615, abs=1e-4))
    assert wilson(0, 0) == (0.0, 1.0)


def test_generation_config_holds_the_runs_stops_and_sampling():
    cfg = {"model": {"temperature": 0.7}, "rollout": {"max_turn_tokens": 32}}
    gen = generation_config({"bos_token_id": 1}, [2, 7], None, cfg)
    assert gen == {
        "bos_token_id": 1,
        "eos_token_id": [2, 7],
        "pad_token_id": 2,
        "do_sample": True,
        "temperature": 0.7,
        "top_p": 1.0,
        "max_new_tokens": 32,
    }


def test_the_card_keeps_text_from_the_config_inside_its_code(tmp_path):
    config = "name: x\nnote: |\n  ``` closes a fence\n  ````` and a longer one\n"
    fenced = _fenced(config, "yaml")
    assert fenced.startswith("``````yaml\n") and fenced.endswith("\n``````")
    run = tmp_path / "run"
    run.mkdir()
    rows = [
        {"step": 0, "phase": "eval", "stage": "baseline", "eval/heldout/success_rate": 0.1,
         "eval/heldout/episodes": 10.0},
        {"step": 3, "phase": "eval", "stage": "train", "eval/heldout/success_rate": 0.7,
         "eval/heldout/episodes": 10.0},
        {"step": 5, "phase": "eval", "stage": "train", "eval/heldout/success_rate": 0.9,
         "eval/heldout/episodes": 10.0},
    ]  # fmt: skip
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    receipt = {
        "run": str(run), "step": 2, "policy_version": 3, "base_model": "tiny-random",
        "lora_merged": False, "parser": "json_list", "stop_token_ids": [2],
        "tracerl_version": "0.1.0",
    }  # fmt: skip
    cfg = {"name": "x", "env": {"name": "search", "kwargs": {"sep": "a|b `c`"}}}
    card = model_card(receipt, config, cfg, "out dir")
    assert "| this checkpoint | `heldout` | 0.700 | 10 | [0.397, 0.892] |" in card  # step 2+1
    assert "| baseline (before training) | `heldout` | 0.100 | 10 |" in card
    assert '``{"sep": "a\\|b `c`"}``' in card  # a pipe cannot split the table's row
    assert fenced in card and "tracerl_json_list" in card and "'out dir'" in card


def test_the_cards_interval_counts_the_decided_episodes_its_rate_is_over():
    """`success_rate` leaves out undecided episodes and crashed rewards: the interval is
    over the episodes it counts (here 5 of 10), not all of them."""
    from tracerl.train.export_card import results

    row = {
        "eval/heldout/success_rate": 1.0,
        "eval/heldout/episodes": 10,
        "eval/heldout/undecided_rate": 0.4,
        "eval/heldout/evaluator_error_rate": 0.1,
    }
    assert results(row) == [("heldout", 1.0, 5, *wilson(5, 5))]
    assert results({**row, "eval/heldout/undecided_rate": 0.0})[0][2] == 9
