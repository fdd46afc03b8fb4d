"""Shared fixtures: real tokenizers and real chat templates, loaded from installed packages."""

from __future__ import annotations

import copy
import importlib.resources
from collections.abc import Callable

import pytest

from tracerl.models.loading import smollm2_tokenizer
from tracerl.models.render import ChatRenderer

# Family special tokens added to SmolLM2's real BPE so each template's control tokens are
# single tokens, as they are in the family's own tokenizer (Qwen and Llama tokenizers are not
# shipped by any package we may install; their templates are, inside `trl`).
FAMILY_TOKENS = {
    "smollm2": {},
    "qwen2_5": {
        "extra": ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"],
        "eos": "<|im_end|>",
    },
    "qwen3": {
        "extra": [
            "<tool_call>",
            "</tool_call>",
            "<tool_response>",
            "</tool_response>",
            "<think>",
            "</think>",
        ],
        "eos": "<|im_end|>",
    },
    "llama3_2": {
        "extra": [
            "<|begin_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
            "<|eom_id|>",
            "<|python_tag|>",
        ],
        "eos": "<|eot_id|>",
        "bos": "<|begin_of_text|>",
    },
}


def trl_template(name: str) -> str:
    """A chat template as shipped in the installed `trl` package (never copied here)."""
    return (importlib.resources.files("trl") / "chat_templates" / f"{name}.jinja").read_text()


@pytest.fixture(scope="session")
def base_tokenizer():
    return smollm2_tokenizer()


@pytest.fixture
def family_renderer(base_tokenizer) -> Callable[..., ChatRenderer]:
    """family_renderer("qwen3", **kwargs) -> a renderer with that family's template."""

    base = base_tokenizer

    def make(family: str, **kwargs) -> ChatRenderer:
        tok = copy.deepcopy(base)  # a fresh copy: tokens are added per family
        spec = FAMILY_TOKENS[family]
        if spec.get("extra"):
            tok.add_special_tokens({"additional_special_tokens": spec["extra"]})
        if spec.get("eos"):
            tok.eos_token = spec["eos"]
        if spec.get("bos"):
            tok.bos_token = spec["bos"]
        template = None if family == "smollm2" else trl_template(family)
        return ChatRenderer(tok, template, **kwargs)

    return make
