"""Remote samplers: generation on an OpenAI-compatible completion server, token ids only.

`RemoteSampler` posts each turn to ``{base_url}/v1/completions`` with the prompt as token
ids and asks for the sampled tokens back as ids with their log-probabilities
(``return_tokens_as_token_ids``, as vLLM serves it; `tracerl serve` speaks the same subset).
Text never crosses the wire in either direction, so nothing is re-tokenized and the
trajectory's tokens are exactly the ones sampled.

A server that cannot be reached, times out, or answers 429/5xx is retried with exponential
backoff; when the retries run out the sampler raises `SamplerUnavailable`, which the runner
records as an infrastructure failure (the environment's, never the policy's). A 4xx other
than 429 is a request the server refuses: a configuration error, raised as such.

The policy version of a result is the server's (``policy_version`` in its answer, which
`tracerl serve` sends), else the version in the adapter name a LoRA hot-load gave it, else
this sampler's own `policy_version`.
"""

from __future__ import annotations

import asyncio
import random
import re
from typing import Any

from tracerl.rollout.endpoints import server_root
from tracerl.rollout.sampler import SampleRequest, SampleResult, SamplerUnavailable
from tracerl.rollout.weight_sync import adapter_version

RETRYABLE = {408, 429, 500, 502, 503, 504}


class RemoteSampler:
    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        temperature: float = 1.0,
        timeout_s: float = 60.0,
        retries: int = 3,
        backoff_s: float = 0.5,
        policy_version: int = 0,
        client: Any = None,
    ) -> None:
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0: greedy), got {temperature}")
        self.base_url = server_root(base_url)  # .../v1 or the root, either way
        self.model = model
        self.temperature = temperature
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.policy_version = policy_version
        self._client = client
        self._owns_client, self._loop = False, None

    def with_temperature(self, temperature: float, seed: int = 0) -> RemoteSampler:
        """This sampler at `temperature` (0: greedy, vLLM's temperature 0), to the same
        server and model as now: an evaluation's (training's is refused at 0 by the config).
        Seeds are each request's (`seed` is unused: there is no sampler-wide generator)."""
        other = RemoteSampler(
            self.base_url,
            self.model,
            temperature=temperature,
            timeout_s=self.timeout_s,
            retries=self.retries,
            backoff_s=self.backoff_s,
            policy_version=self.policy_version,
            client=None if self._owns_client else self._client,
        )
        return other

    def _http(self) -> Any:
        """The HTTP client, one per event loop: a trainer runs each step's rollouts in an
        `asyncio.run` of its own, and a client cannot outlive the loop it was made in."""
        loop = asyncio.get_running_loop()
        if self._client is None or (self._owns_client and self._loop is not loop):
            import httpx

            self._client = httpx.AsyncClient(timeout=self.timeout_s)
            self._owns_client, self._loop = True, loop
        return self._client

    def body(self, request: SampleRequest) -> dict[str, Any]:
        """The completion request: token ids in, token ids and log-probs out."""
        return {
            "model": self.model,
            "prompt": list(request.prompt_ids),
            "max_tokens": request.max_tokens,
            "temperature": self.temperature,
            "top_p": 1.0,
            "seed": request.seed,
            "logprobs": 1,
            "stop_token_ids": sorted(request.stop_token_ids),
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
            # vLLM leaves a matched stop token out of the output unless asked: the
            # end-of-turn token is the policy's, with its log-prob, like any other
            "include_stop_str_in_output": True,
            # stop where the in-process sampler stops (the template's turn-end ids, sent
            # above), not at another id a model's generation config calls EOS
            "ignore_eos": True,
        }

    async def sample(self, request: SampleRequest) -> SampleResult:
        import httpx

        url = f"{self.base_url}/v1/completions"
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1) * random.uniform(0.5, 1))
            try:
                r = await self._http().post(url, json=self.body(request))
            except (httpx.TransportError, httpx.TimeoutException) as e:
                last = f"{type(e).__name__}: {e}"
                continue
            if r.status_code in RETRYABLE:
                last = f"HTTP {r.status_code}: {r.text[:200]}"
                continue
            if r.status_code != 200:
                raise ValueError(f"{url} refused the request: HTTP {r.status_code}: {r.text[:300]}")
            return self.result(r.json(), request)
        raise SamplerUnavailable(f"{url}: {self.retries + 1} attempts failed; last: {last}")

    def result(self, answer: dict[str, Any], request: SampleRequest) -> SampleResult:
        choice = answer["choices"][0]
        lp = choice.get("logprobs") or {}
        tokens = [_token_id(t) for t in lp.get("tokens") or []]
        logprobs = [float(x) for x in lp.get("token_logprobs") or []]
        if len(tokens) != len(logprobs) or not tokens:
            raise ValueError(
                "the server did not return token ids with log-probs; it must support "
                "return_tokens_as_token_ids and logprobs (vLLM does, `tracerl serve` does)"
            )
        finish = "stop" if choice.get("finish_reason") == "stop" else "length"
        if finish == "stop" and tokens[-1] not in request.stop_token_ids:
            raise ValueError(
                "the server stopped without returning the stop token among the sampled ids "
                f"(last token {tokens[-1]}); the end of the turn would be lost from the "
                "trajectory. It must honour include_stop_str_in_output (vLLM does)"
            )
        version = answer.get("policy_version")
        if version is None:
            version = adapter_version(str(answer.get("model", "")))
        if version is None:
            version = self.policy_version
        # the receipt's policy_version is the sampler's: the newest the server has shown
        self.policy_version = max(self.policy_version, int(version))
        return SampleResult(tokens, logprobs, finish, int(version))

    async def close(self) -> None:
        if self._client is not None:
            if not self._owns_client or self._loop is asyncio.get_running_loop():
                await self._client.aclose()
            self._client = None


def _token_id(token: Any) -> int:
    """vLLM writes a token as ``token_id:123`` when asked for ids."""
    if isinstance(token, int):
        return token
    m = re.fullmatch(r"token_id:(\d+)", str(token))
    if m is None:
        raise ValueError(f"expected a token id ('token_id:<n>'), got {token!r}")
    return int(m.group(1))
