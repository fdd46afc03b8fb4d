"""A teacher behind an OpenAI-compatible server: prompt log-probs for given token ids.

    POST {base_url}/completions  {"model", "prompt": [ids], "max_tokens": 1,
                                  "temperature": T, "prompt_logprobs": 0}
    -> choices[0].prompt_logprobs: [None, {"<id>": {"logprob": ...}}, ...]

vLLM answers this (``prompt_logprobs``: each prompt position's log-prob of the token that is
there, and the top k others), and so does ``tracerl serve``. The token ids are sent as they
are (never text: a re-tokenization would score other tokens). One request per trajectory,
retried on a timeout, a refused connection or a 5xx; a trajectory that still has no answer
is unscored (why, as a string), the evaluator's, never a zero.

The temperature: the student's log-probs were recorded at the run's sampling temperature,
so the teacher's must be at it too. `check` asks the server once at that temperature and at
1.0 on the same ids: a server whose prompt log-probs ignore the temperature (raw logits)
would answer both alike, and is refused for a run that samples at another temperature (one
that refuses the second temperature, as ``tracerl serve`` does, answers at the first).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import httpx

from tracerl.errors import UserError
from tracerl.rollout.endpoints import bearer_headers, openai_base_url
from tracerl.types import Trajectory

RETRYABLE = (httpx.TimeoutException, httpx.ConnectError, httpx.RemoteProtocolError)


class TeacherUnavailable(RuntimeError):
    """No answer from the server (after the retries), or an answer that is not prompt
    log-probs for the ids sent."""


class ServerTeacher:
    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key_env: str | None = None,
        timeout_s: float = 120.0,
        retries: int = 2,
        sleep: Any = time.sleep,
        tokenizer: Any = None,
        folded: float | None = None,
    ) -> None:
        """`tokenizer`: the student's, to check the server reads the ids as it does.
        `folded`: the server's model has this temperature folded into its logits
        (`tracerl.train.distill.folded`): it is asked at 1, and only at this temperature."""
        self.url = openai_base_url(base_url) + "/completions"
        self.model = model
        self.retries, self.sleep = retries, sleep
        headers = bearer_headers(api_key_env, "trainer.distill.server")
        self.identity = f"server:{self.url}|{model}"
        self.label = f"{model} at {base_url}"
        self.requests = 0
        self.tokenizer, self.checked, self.folded = tokenizer, False, folded
        self._http = httpx.Client(headers=headers, timeout=timeout_s)

    @classmethod
    def of(cls, cfg: Any, tokenizer: Any = None) -> ServerTeacher:
        """From ``trainer.distill.server`` (`tracerl.config.distill.TeacherServer`)."""
        return cls(
            cfg.base_url,
            cfg.model,
            api_key_env=cfg.api_key_env,
            timeout_s=cfg.timeout_s,
            retries=cfg.retries,
            tokenizer=tokenizer,
        )

    def __repr__(self) -> str:
        return f"ServerTeacher({self.label!r})"

    def prompt_logprobs(self, ids: Sequence[int], temperature: float) -> list[float]:
        """The server's log-prob of each of `ids` given those before it (0 at position 0)."""
        return [lp for lp, _ in self._ask(ids, temperature)]

    def _wire(self, temperature: float) -> float:
        """The temperature to ask the server for: `temperature`, or (folded) 1."""
        if self.folded is None:
            return temperature
        if abs(temperature - self.folded) > 1e-9:
            raise UserError(
                f"trainer.distill: the served teacher has temperature {self.folded} folded "
                f"into its logits, and the run samples at {temperature}",
                "serve it again folded at the run's temperature",
            )
        return 1.0

    def _ask(self, ids: Sequence[int], temperature: float) -> list[tuple[float, str | None]]:
        """Per position: the log-prob, and the token as the server decodes it (if it says)."""
        body = {
            "model": self.model,
            "prompt": list(ids),
            "max_tokens": 1,
            "temperature": self._wire(temperature),
            "prompt_logprobs": 0,
        }
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                self.sleep(min(2.0**attempt, 10.0))
            self.requests += 1
            try:
                r = self._http.post(self.url, json=body)
            except RETRYABLE as e:
                last = f"{type(e).__name__}: {e}"
                continue
            except httpx.HTTPError as e:
                raise TeacherUnavailable(f"{self.url}: {type(e).__name__}: {e}") from None
            if r.status_code >= 500:
                last = f"HTTP {r.status_code}: {r.text[:200]}"
                continue
            if r.status_code != 200:  # a request the server refuses: retrying cannot help
                raise TeacherUnavailable(f"{self.url}: HTTP {r.status_code}: {r.text[:200]}")
            return _parse(r, ids)
        raise TeacherUnavailable(f"{self.url}: {last} (after {self.retries + 1} attempts)")

    def logprobs(self, rows: Sequence[Trajectory], temperature: float) -> list[list[float] | str]:
        if not self.checked and rows:
            probe = next((t.token_ids[:64] for t in rows if len(t) > 1), None)
            if probe is not None:
                self.check(probe, temperature)
                self.checked = True
        out: list[list[float] | str] = []
        for t in rows:
            if len(t) == 0:
                out.append([])
                continue
            try:
                out.append(self.prompt_logprobs(t.token_ids, temperature))
            except TeacherUnavailable as e:
                out.append(str(e))
        return out

    def check(self, ids: Sequence[int], temperature: float) -> None:
        """Refuse a server whose tokens are not the student's (the tokens it says it scored
        against the student's tokenizer's decoding of the same ids), or whose prompt
        log-probs ignore `temperature` (see the module). Done before its first scores."""
        try:
            answered = self._ask(ids, temperature)
        except TeacherUnavailable as e:
            raise UserError(
                f"trainer.distill.server: {self.label} did not score a probe: {e}",
                "start the server, or check base_url and model (it must answer "
                "prompt_logprobs for token ids, as vLLM and tracerl serve do)",
            ) from None
        if self.tokenizer is not None:
            for i, (_, said) in enumerate(answered[1:], start=1):
                mine = self.tokenizer.decode([ids[i]])
                # a token that is part of a character's bytes decodes to '' on one side and
                # to U+FFFD on the other: only whole-text tokens are compared
                partial = not said or not mine or "\ufffd" in said + mine
                if said is not None and not partial and said != mine:
                    raise UserError(
                        f"trainer.distill.server: {self.label} reads token id {ids[i]} as "
                        f"{said!r}, the student's tokenizer as {mine!r}: another vocabulary",
                        "serve a teacher of the student's family (cross-tokenizer "
                        "distillation is not supported)",
                    )
        if abs(temperature - 1.0) < 1e-9 or self.folded is not None:
            return
        at_t = [lp for lp, _ in answered]
        try:
            at_1 = self.prompt_logprobs(ids, 1.0)
        except TeacherUnavailable:  # it refuses other temperatures (tracerl serve): it
            return  # answers at the one it was asked, as its sampling does
        if max(abs(a - b) for a, b in zip(at_t[1:], at_1[1:], strict=True)) < 1e-6:
            raise UserError(
                f"trainer.distill.server: {self.label} gives the same prompt log-probs at "
                f"temperature {temperature} and 1.0: they ignore the temperature, and the "
                f"student's were recorded at {temperature}",
                "sample at model.temperature: 1.0, or load the teacher in this process "
                "(trainer.distill.teacher)",
            )

    def close(self) -> None:
        self._http.close()


def _parse(r: httpx.Response, ids: Sequence[int]) -> list[tuple[float, str | None]]:
    """Each position's log-prob of the token sent there, and its decoded text where the
    server gives it, from vLLM's ``prompt_logprobs`` (a list with None first, then per
    position a dict keyed by token id)."""
    try:
        entries = r.json()["choices"][0]["prompt_logprobs"]
        if not isinstance(entries, list) or len(entries) != len(ids):
            raise ValueError(f"{len(entries or [])} positions for {len(ids)} ids")
        out: list[tuple[float, str | None]] = [(0.0, None)]
        for i in range(1, len(ids)):
            entry = entries[i][str(ids[i])]
            if isinstance(entry, dict):
                out.append((float(entry["logprob"]), entry.get("decoded_token")))
            else:
                out.append((float(entry), None))
        return out
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise TeacherUnavailable(
            f"not prompt log-probs for the ids sent ({type(e).__name__}: {e}): {r.text[:200]}"
        ) from None
