"""Action parsers per model family: calls, answers, and malformed turns as values."""

from __future__ import annotations

import pytest

from tracerl.envs import get_parser, parser_for_model


def test_hermes_calls_and_answers():
    p = get_parser("hermes")
    text = (
        'Let me check.\n<tool_call>\n{"name": "lookup_order", "arguments": {"order_id": "A1"}}\n'
        '</tool_call>\n<tool_call>{"name": "get_refund_policy", "arguments": "{}"}</tool_call>'
    )
    a = p.parse(text, step=3)
    assert [(c.id, c.name, c.arguments) for c in a.tool_calls] == [
        ("call_3_0", "lookup_order", {"order_id": "A1"}),
        ("call_3_1", "get_refund_policy", {}),
    ]
    assert a.error is None and not a.is_final
    final = p.parse("  The refund is done.  ", step=4)
    assert final.is_final and final.answer == "The refund is done."
    assert p.parse(p.format_calls([("f", {"x": 1})]), step=0).tool_calls[0].arguments == {"x": 1}


def test_json_list_is_smollm2s_format():
    p = get_parser("json_list")
    text = p.format_calls([("a", {"q": "x"}), ("b", {})])
    assert text.startswith("<tool_call>[") and text.endswith("]</tool_call>")
    a = p.parse(text, step=0)
    assert [c.name for c in a.tool_calls] == ["a", "b"]
    assert a.tool_calls[0].raw == text[len("<tool_call>") : -len("</tool_call>")]
    assert parser_for_model("smollm2-135m-instruct").name == "json_list"
    assert parser_for_model("Qwen2.5-7B-Instruct").name == "hermes"
    with pytest.raises(KeyError, match="no tool-call parser is known for model 'mystery-model'"):
        parser_for_model("mystery-model")


def test_a_folders_parser_comes_from_its_export_never_from_its_name(tmp_path):
    """`hf:` folders: the parser a tracerl export names; a name that looks like a family's
    says nothing, and with no parser named the error says which key to set."""
    from tracerl.envs.parsers import NoParserError

    named = tmp_path / "policy-v3"
    named.mkdir()
    (named / "tracerl_export.json").write_text('{"parser": "hermes"}')
    assert parser_for_model(f"hf:{named}").name == "hermes"
    looks = tmp_path / "smollm2-finetune"  # no export metadata
    looks.mkdir()
    with pytest.raises(NoParserError) as e:
        parser_for_model(f"hf:{looks}")
    assert e.value.hint.startswith("set env.parser to the format it writes tool calls in:")


@pytest.mark.parametrize(
    ("parser", "text", "needle"),
    [
        ("hermes", "<tool_call>{not json}</tool_call>", "invalid JSON"),
        ("hermes", '<tool_call>{"name": "f"', "unbalanced"),
        ("hermes", '<tool_call>[{"name": "f", "arguments": {}}]</tool_call>', "not a list"),
        ("hermes", '<tool_call>{"arguments": {}}</tool_call>', "no 'name'"),
        ("hermes", '<tool_call>{"name": "f", "arguments": [1]}</tool_call>', "must be an object"),
        ("json_list", "<tool_call>[]</tool_call>", "empty"),
        ("json_list", '<tool_call>["f"]</tool_call>', "expected an object"),
        ("search_r1", "I think the answer is Paris.", "no action found"),
        ("search_r1", "<search>a</search><answer>b</answer>", "not both"),
        ("search_r1", "<search>a</search><search>b</search>", "one <search>"),
        ("search_r1", "<search>  </search>", "empty"),
    ],
)
def test_malformed_turns_are_parse_errors_for_the_policy(parser, text, needle):
    a = get_parser(parser).parse(text, step=0)
    assert a.error is not None and needle in a.error.message
    assert a.error.kind.value == "parse_error" and a.error.attribution.value == "policy"
    assert not a.tool_calls and not a.is_final


def test_search_r1_tags():
    p = get_parser("search_r1")
    a = p.parse("<think>need facts</think>\n<search> capital of France </search>", step=2)
    assert [(c.id, c.name, c.arguments) for c in a.tool_calls] == [
        ("call_2_0", "search", {"query": "capital of France"})
    ]
    done = p.parse("<think>ok</think><answer> Paris </answer>", step=3)
    assert done.is_final and done.answer == "Paris"
    assert p.format_answer("Paris") == "<answer>Paris</answer>"
    with pytest.raises(KeyError, match="valid: hermes, json_list, search_r1"):
        get_parser("xml")
