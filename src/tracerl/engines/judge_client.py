"""The judge's side of the wire: an OpenAI-compatible chat endpoint (vLLM, `tracerl serve`'s
OpenAI-compatible servers, SGLang, a hosted API), as a `tracerl.rewards.judge.JudgeClient`.

``base_url`` is what the OpenAI SDK calls it (``http://host:8000/v1``; a bare server root
gets ``/v1``, `tracerl.rollout.endpoints.openai_base_url`); the request is a
``POST {base_url}/chat/completions`` at temperature 0 (``temperature``; None sends none,
for a server that samples at a temperature of its own). The API key comes from the
environment variable the config names (``api_key_env``), never from the config itself, so
it never lands in a run directory or a cache. A timeout, a refused connection, an HTTP
error or a body that is not a chat completion is `JudgeUnavailable` (the judge retries it);
what the judge replied is parsed by the rubric, not here.
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from tracerl.rewards.judge import JudgeReply, JudgeUnavailable
from tracerl.rollout.endpoints import bearer_headers, openai_base_url


class OpenAIJudgeClient:
    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key_env: str | None = None,
        timeout_s: float = 60.0,
        max_tokens: int = 256,
        temperature: float | None = 0.0,
    ) -> None:
        self.url = openai_base_url(base_url) + "/chat/completions"
        self.model = model
        self.max_tokens = max_tokens
        self.temperature = temperature
        headers = bearer_headers(api_key_env, "judge")
        self.timeout_s = timeout_s
        self.identity = {
            "url": self.url,
            "model": model,
            "temperature": temperature,
            "max_tokens": max_tokens,
        }
        """What decides a verdict besides the messages (the judge's cache key): another
        endpoint serving a model of the same name is another judge."""
        self._http = httpx.Client(headers=headers, timeout=timeout_s)

    def complete(self, messages: list[dict[str, str]]) -> JudgeReply:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": self.max_tokens,
        }
        if self.temperature is not None:  # None: the endpoint's own
            body["temperature"] = self.temperature
        t0 = time.perf_counter()
        try:
            r = self._http.post(self.url, json=body)
        except httpx.TimeoutException:
            raise JudgeUnavailable(f"{self.url}: no answer in {self.timeout_s:g} s") from None
        except httpx.HTTPError as e:
            raise JudgeUnavailable(f"{self.url}: {type(e).__name__}: {e}") from None
        latency = time.perf_counter() - t0
        if r.status_code != 200:
            raise JudgeUnavailable(f"{self.url}: HTTP {r.status_code}: {r.text[:200]}")
        try:
            data: Any = r.json()
            text = data["choices"][0]["message"]["content"]
            usage = data.get("usage") or {}
            if not isinstance(text, str):
                raise TypeError(f"content is {type(text).__name__}")
            return JudgeReply(
                text,
                int(usage.get("prompt_tokens", 0)),
                int(usage.get("completion_tokens", 0)),
                latency,
            )
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise JudgeUnavailable(
                f"{self.url}: not a chat completion ({type(e).__name__}: {e}): {r.text[:200]}"
            ) from None

    def close(self) -> None:
        self._http.close()
