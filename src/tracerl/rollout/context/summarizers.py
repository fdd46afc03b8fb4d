"""Summaries written by someone other than the policy: a function, an OpenAI-compatible
endpoint, or (in replay) the recorded ones. Their text is environment-authored: it lands
in the next sample's prompt and never carries loss."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from tracerl.rollout.context.config import SummarizerConfig
from tracerl.rollout.endpoints import bearer_headers, openai_base_url

Summarize = Callable[[list[dict[str, str]]], Awaitable[str]]
"""The conversation so far (role and text) -> the summary."""


class SummarizerError(RuntimeError):
    """The summarizer failed or answered something that is not text: the environment's."""


def make_summarizer(cfg: SummarizerConfig) -> Summarize | None:
    """The configured summarizer (None: the policy writes its own summaries)."""
    if cfg.by == "function":
        from tracerl.imports import load_object

        return _bounded(_call_function(load_object(cfg.fn or "", "summarizer")), cfg.timeout_s)
    if cfg.by == "endpoint":
        return _bounded(_endpoint(cfg), cfg.timeout_s)
    return None


def recorded_summaries(records: Sequence[dict[str, Any]]) -> Summarize:
    """Replay: the summaries a function or endpoint wrote, in the order they were written."""
    texts = [r["summary"] for r in records if r.get("summary_by") in ("function", "endpoint")]

    async def summarize(messages: list[dict[str, str]]) -> str:
        if not texts:
            raise SummarizerError("the replay asked for a summary that was never recorded")
        return texts.pop(0)

    return summarize


def _call_function(fn: Any) -> Summarize:
    if not callable(fn):
        raise SummarizerError(f"rollout.context.summarizer.fn is {type(fn).__name__}, not callable")

    async def summarize(messages: list[dict[str, str]]) -> str:
        out = await asyncio.to_thread(fn, messages)
        if inspect.isawaitable(out):
            out = await out
        return out

    return summarize


def _bounded(summarize: Summarize, timeout_s: float) -> Summarize:
    async def bounded(messages: list[dict[str, str]]) -> str:
        try:
            text = await asyncio.wait_for(summarize(messages), timeout_s)
        except TimeoutError:
            raise SummarizerError(f"no summary within {timeout_s:g} s") from None
        except SummarizerError:
            raise
        except Exception as e:
            raise SummarizerError(f"{type(e).__name__}: {e}") from e
        if not isinstance(text, str):
            raise SummarizerError(f"the summarizer returned {type(text).__name__}, not text")
        return text

    return bounded


def _endpoint(cfg: SummarizerConfig) -> Summarize:
    import httpx

    url = openai_base_url(cfg.base_url or "") + "/chat/completions"
    headers = bearer_headers(cfg.api_key_env, "rollout.context.summarizer")

    async def summarize(messages: list[dict[str, str]]) -> str:
        transcript = "\n\n".join(f"{m['role']}: {m['content']}" for m in messages)
        body = {
            "model": cfg.model,
            "messages": [
                {"role": "system", "content": cfg.instruction},
                {"role": "user", "content": transcript},
            ],
            "max_tokens": cfg.max_tokens,
            "temperature": 0.0,
        }
        async with httpx.AsyncClient(timeout=cfg.timeout_s) as client:
            response = await client.post(url, json=body, headers=headers)
        if response.status_code != 200:
            raise SummarizerError(f"{url} answered {response.status_code}: {response.text[:200]}")
        try:
            return response.json()["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise SummarizerError(f"{url}: no message in the answer ({e})") from None

    return summarize
