"""One judge: a rubric, a client for some model, a disk cache of verdicts, and retries.

`Judge.verdict(task, answer, evidence)` asks the model (through `JudgeClient`, a protocol:
the HTTP client for an OpenAI-compatible endpoint lives outside `tracerl.rewards`) for the
rubric's verdict. A verdict is cached on disk under the hash of everything that decides it
(the rubric's key, the model, the messages): the same question is never asked twice, across
runs too. A reply that is not a verdict, a timeout or an endpoint error is retried; when no
attempt gives a verdict, `JudgeFailed` says why, and the reward composer turns it into an
undecided episode attributed to the evaluator (never a reward of 0). Every verdict says what
it cost (tokens, latency, attempts) and whether it came from the cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from tracerl.rewards.judge.rubric import Rubric, Verdict, VerdictError, parse_verdict


class JudgeUnavailable(RuntimeError):
    """The endpoint did not answer: a timeout, a refused connection, an HTTP error."""


class JudgeFailed(RuntimeError):
    """No attempt gave a verdict (the evaluator's failure, not the policy's)."""


@dataclass(frozen=True)
class JudgeReply:
    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0


class JudgeClient(Protocol):
    model: str
    """The judge model's name (part of the cache key)."""

    def complete(self, messages: list[dict[str, str]]) -> JudgeReply:
        """The model's reply (temperature 0); `JudgeUnavailable` when there is none."""
        ...


@dataclass(frozen=True)
class Judged:
    """A verdict and what it cost. `cached`: no request was made (tokens and latency are
    then those of the request that made it, counted once)."""

    verdict: Verdict
    model: str
    rubric: str
    rubric_version: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    attempts: int = 1
    cached: bool = False

    def evidence(self) -> dict[str, Any]:
        """What the reward breakdown records."""
        out = asdict(self)
        out["verdict"] = {"value": self.verdict.value, "raw": self.verdict.raw}
        out["reason"] = self.verdict.reason
        return out


class VerdictCache:
    """Verdicts on disk, one JSON file each, named by the question's hash; written to a
    temporary name and renamed, so a file that exists is whole."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)

    def _path(self, key: str) -> Path:
        return self.folder / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        try:
            return json.loads(self._path(key).read_text())
        except (OSError, ValueError):
            return None

    def put(self, key: str, record: dict[str, Any]) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}")
        tmp.write_text(json.dumps(record))
        tmp.replace(path)


class Judge:
    def __init__(
        self,
        rubric: Rubric,
        client: JudgeClient,
        cache: VerdictCache | None = None,
        retries: int = 2,
    ) -> None:
        if retries < 0:
            raise ValueError(f"judge: retries must be >= 0, got {retries}")
        self.rubric = rubric
        self.client = client
        self.cache = cache
        self.retries = retries

    def key(self, messages: list[dict[str, str]]) -> str:
        spec = {"rubric": self.rubric.key, "model": self.client.model, "messages": messages}
        return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()

    def verdict(self, task: str, answer: str, evidence: list[str] | tuple = ()) -> Judged:
        messages = self.rubric.messages(task, answer, evidence)
        key = self.key(messages)
        known = self.cache.get(key) if self.cache is not None else None
        if known is not None:
            try:
                return self._judged(known, cached=True)
            except (KeyError, TypeError, ValueError):
                pass  # a record from another version of this code: ask again
        errors: list[str] = []
        for attempt in range(1, self.retries + 2):
            try:
                reply = self.client.complete(messages)
                verdict = parse_verdict(reply.text, self.rubric.verdict)
            except (JudgeUnavailable, VerdictError) as e:
                errors.append(f"{type(e).__name__}: {e}")
                continue
            record = {
                "value": verdict.value,
                "raw": verdict.raw,
                "reason": verdict.reason,
                "prompt_tokens": reply.prompt_tokens,
                "completion_tokens": reply.completion_tokens,
                "latency_s": reply.latency_s,
                "attempts": attempt,
            }
            if self.cache is not None:
                self.cache.put(key, record)
            return self._judged(record, cached=False)
        raise JudgeFailed(
            f"judge {self.rubric.name!r} ({self.client.model}): no verdict in "
            f"{self.retries + 1} attempts: " + "; ".join(errors)
        )

    def _judged(self, record: dict[str, Any], cached: bool) -> Judged:
        return Judged(
            Verdict(float(record["value"]), record["raw"], str(record.get("reason", ""))),
            self.client.model,
            self.rubric.name,
            self.rubric.version,
            int(record["prompt_tokens"]),
            int(record["completion_tokens"]),
            float(record["latency_s"]),
            int(record["attempts"]),
            cached,
        )
