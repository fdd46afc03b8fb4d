"""One judge: a rubric, a client for some model, a disk cache of verdicts, and retries.

`Judge.verdict(task, answer, evidence)` asks the model (through `JudgeClient`, a protocol:
the HTTP client for an OpenAI-compatible endpoint lives outside `tracerl.rewards`) for the
rubric's verdict. A verdict is cached on disk under the hash of everything that decides it
(the rubric's key, the model, the messages): the same question is never asked twice, across
runs too. A reply that is not a verdict, a timeout or an endpoint error is retried; when no
attempt gives a verdict, `JudgeFailed` says why, and the reward composer turns it into an
undecided episode attributed to the evaluator (never a reward of 0). Every verdict says what
it cost (tokens, latency, attempts) and whether it came from the cache.

`Judge.group_verdict` asks for a group-relative verdict (one call scores every answer of a
group against the others); it is cached and retried the same way.

A `JudgeBudget` caps what the judge may spend per training step (requests and tokens; a
cached verdict costs nothing): once a step's budget is spent, further questions of that
step are refused without a request (`JudgeBudgetSpent`, a `JudgeFailed`: the episode is
undecided and the evaluator's, as for any other failure). The step is the policy version
that sampled the episode (an evaluation is one step).

Within one process a question is also remembered in memory (the last `MEMORY_SIZE`), and
a failure for `FAILURE_MEMORY_S`, so the members of a group scoring one group verdict make
one request between them, and a question the first member failed is not asked again by the
next one (an outage is not remembered for the rest of the run).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from pydantic import ConfigDict, Field
from pydantic.dataclasses import dataclass as pydantic_dataclass

from tracerl.rewards.judge.rubric import (
    Rubric,
    Verdict,
    parse_group_verdict,
    parse_verdict,
)

MEMORY_SIZE = 100_000
"""Questions a judge remembers in memory (the least recently used are forgotten; the disk
cache still has their verdicts)."""
FAILURE_MEMORY_S = 60.0
"""How long a failed question is answered from memory with its failure (a group's members
asking the question its first member failed), before it is asked again."""
ASKING_STRIPES = 64


class JudgeUnavailable(RuntimeError):
    """The endpoint did not answer: a timeout, a refused connection, an HTTP error."""


class JudgeFailed(RuntimeError):
    """No attempt gave a verdict (the evaluator's failure, not the policy's). `evidence`:
    what the reward breakdown records (the judge, the attempts' errors, what they cost)."""

    def __init__(self, message: str, evidence: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.evidence = dict(evidence or {})


class JudgeBudgetSpent(JudgeFailed):
    """The step's judge budget was spent before this question: it was not asked."""


@pydantic_dataclass(frozen=True, config=ConfigDict(extra="forbid"))
class JudgeBudget:
    """What one judge may spend per step: requests (attempts count, a cached verdict does
    not) and tokens (prompt + completion). None: no cap. (Also a judge component's
    ``budget`` param, checked as it is given.)"""

    calls_per_step: int | None = Field(None, ge=1)
    tokens_per_step: int | None = Field(None, ge=1)


@dataclass
class _Spent:
    calls: int = 0
    tokens: int = 0


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
    """A verdict and what it cost. `cached`: no request was made (from the disk cache, or
    another member's request for the same group verdict): tokens, latency and attempts are
    then 0, so summed over episodes each request counts once."""

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
        """What the reward breakdown records (``judge``: the rubric's name, how cost and
        calibration find judged components; ``tokens``: prompt + completion, as a failure's
        evidence counts its attempts')."""
        out = asdict(self)
        out["judge"] = out.pop("rubric")
        out["tokens"] = self.prompt_tokens + self.completion_tokens
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

    def put(self, key: str, record: dict[str, Any]) -> bool:
        """Store a verdict; False when the folder cannot take it (a full or read-only
        disk: the verdict stands, it is only not cached)."""
        path = self._path(key)
        tmp = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(record))
            tmp.replace(path)
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            return False
        return True


class Judge:
    def __init__(
        self,
        rubric: Rubric,
        client: JudgeClient,
        cache: VerdictCache | None = None,
        retries: int = 2,
        budget: JudgeBudget | None = None,
    ) -> None:
        if retries < 0:
            raise ValueError(f"judge: retries must be >= 0, got {retries}")
        self.rubric = rubric
        self.client = client
        self.cache = cache
        self.retries = retries
        self.budget = budget or JudgeBudget()
        self._spent: dict[Hashable, _Spent] = {}
        self._memory: OrderedDict[str, dict[str, Any] | tuple[JudgeFailed, float]] = OrderedDict()
        self._lock = threading.Lock()
        # one question is asked by one thread at a time (striped: a bounded set of locks)
        self._asking = [threading.Lock() for _ in range(ASKING_STRIPES)]

    def key(self, messages: list[dict[str, str]]) -> str:
        """The question's hash: the rubric, the judge (its model, and what else of the
        client changes a verdict: `identity`, e.g. endpoint, temperature, reply length) and
        the messages."""
        judge = getattr(self.client, "identity", None) or self.client.model
        spec = {"rubric": self.rubric.key, "model": judge, "messages": messages}
        return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()

    def verdict(
        self,
        task: str,
        answer: str,
        evidence: Sequence[str] = (),
        *,
        reference: Sequence[str] | None = None,
        step: Hashable = None,
    ) -> Judged:
        """The rubric's verdict on `answer` (`step`: whose budget pays for a request)."""
        messages = self.rubric.messages(task, answer, evidence, reference)
        record, cached = self._ask(
            messages, lambda text: [parse_verdict(text, self.rubric.verdict)], step
        )
        return self._judged(record, 0, cached)

    def group_verdict(
        self,
        task: str,
        answers: Sequence[str],
        evidence: Sequence[Sequence[str]] = (),
        *,
        reference: Sequence[str] | None = None,
        step: Hashable = None,
    ) -> list[Judged]:
        """One group-relative verdict on all `answers`: each answer's, in order, each
        carrying what this call cost (a member keeps only its own: the member whose scoring
        made the request records its cost, the others get the verdict from memory, cached,
        at no cost)."""
        n = len(answers)
        messages = self.rubric.group_messages(task, answers, evidence, reference)
        schema = self.rubric.verdict
        record, cached = self._ask(
            messages, lambda text: parse_group_verdict(text, schema, n), step
        )
        return [self._judged(record, i, cached) for i in range(n)]

    def _ask(
        self,
        messages: list[dict[str, str]],
        parse: Callable[[str], list[Verdict]],
        step: Hashable,
    ) -> tuple[dict[str, Any], bool]:
        """The verdict record for `messages` (from memory, the disk cache or the model) and
        whether it was cached. One question is asked by one thread at a time."""
        key = self.key(messages)
        with self._asking[int(key[:8], 16) % ASKING_STRIPES]:
            known = self._remembered(key)
            if isinstance(known, JudgeFailed):
                raise known
            if known is None and self.cache is not None:
                known = self.cache.get(key)
                if known is not None and not _whole(known):
                    known = None  # a record from another version of this code: ask again
            if known is not None:
                self._remember(key, known)
                return known, True
            try:
                record = self._request(messages, parse, step)
            except JudgeFailed as e:
                if not isinstance(e, JudgeBudgetSpent):  # a later step may afford it
                    self._remember(key, (e, time.monotonic()))
                raise
            self._remember(key, record)
            if self.cache is not None:
                self.cache.put(key, record)
            return record, False

    def _remembered(self, key: str) -> dict[str, Any] | JudgeFailed | None:
        """A verdict record asked in this process, or a failure of the last
        `FAILURE_MEMORY_S` seconds (an outage is not remembered for the rest of the run)."""
        with self._lock:
            known = self._memory.get(key)
            if known is None:
                return None
            self._memory.move_to_end(key)
            if isinstance(known, tuple):
                failure, when = known
                if time.monotonic() - when <= FAILURE_MEMORY_S:
                    # a new failure, costing nothing: the attempts were counted once
                    evidence = {**failure.evidence, "attempts": 0, "tokens": 0}
                    return JudgeFailed(str(failure), {**evidence, "remembered": True})
                del self._memory[key]
                return None
            return known

    def _remember(self, key: str, value: dict[str, Any] | tuple[JudgeFailed, float]) -> None:
        with self._lock:
            self._memory[key] = value
            self._memory.move_to_end(key)
            while len(self._memory) > MEMORY_SIZE:
                self._memory.popitem(last=False)

    def _request(
        self, messages: list[dict[str, str]], parse: Callable[[str], list[Verdict]], step: Hashable
    ) -> dict[str, Any]:
        errors: list[str] = []
        tokens = 0
        who = {
            "judge": self.rubric.name,
            "rubric_version": self.rubric.version,
            "model": self.client.model,
        }
        for attempt in range(1, self.retries + 2):
            refusal = self._charge(step)
            if refusal is not None:
                raise JudgeBudgetSpent(
                    f"judge {self.rubric.name!r}: {refusal}; not asked",
                    {
                        **who,
                        "budget": refusal,
                        "attempts": attempt - 1,
                        "errors": errors,
                        "tokens": tokens,
                    },
                )
            try:
                reply = self.client.complete(messages)
            except Exception as e:  # JudgeUnavailable, or whatever a user's client raises
                errors.append(f"{type(e).__name__}: {e}")
                continue
            used = int(reply.prompt_tokens) + int(reply.completion_tokens)
            tokens += used
            with self._lock:
                self._spent.setdefault(step, _Spent()).tokens += used
            try:
                verdicts = parse(reply.text)
            except Exception as e:  # a VerdictError, or a reply no parser foresaw
                errors.append(f"{type(e).__name__}: {e}")
                continue
            return {
                "verdicts": [
                    {"value": v.value, "raw": v.raw, "reason": v.reason} for v in verdicts
                ],
                "prompt_tokens": reply.prompt_tokens,
                "completion_tokens": reply.completion_tokens,
                "latency_s": reply.latency_s,
                "attempts": attempt,
            }
        raise JudgeFailed(
            f"judge {self.rubric.name!r} ({self.client.model}): no verdict in "
            f"{self.retries + 1} attempts: " + "; ".join(errors),
            {**who, "attempts": self.retries + 1, "errors": errors, "tokens": tokens},
        )

    def _charge(self, step: Hashable) -> str | None:
        """Count one request against `step`'s budget, or say why the budget refuses it."""
        b = self.budget
        with self._lock:
            spent = self._spent.setdefault(step, _Spent())
            if b.calls_per_step is not None and spent.calls >= b.calls_per_step:
                return f"the step's budget of {b.calls_per_step} judge requests is spent"
            if b.tokens_per_step is not None and spent.tokens >= b.tokens_per_step:
                return (
                    f"the step's budget of {b.tokens_per_step} judge tokens is spent "
                    f"({spent.tokens} used)"
                )
            spent.calls += 1
            return None

    def _judged(self, record: dict[str, Any], i: int, cached: bool) -> Judged:
        v = record["verdicts"][i]
        return Judged(
            Verdict(float(v["value"]), v["raw"], str(v.get("reason", ""))),
            self.client.model,
            self.rubric.name,
            self.rubric.version,
            0 if cached else int(record["prompt_tokens"]),
            0 if cached else int(record["completion_tokens"]),
            0.0 if cached else float(record["latency_s"]),
            0 if cached else int(record["attempts"]),
            cached,
        )


def _whole(record: Any) -> bool:
    """A cached record as this code writes it (values finite numbers): anything else is
    asked again."""
    try:
        return (
            bool(record["verdicts"])
            and all(
                isinstance(v, dict)
                and "raw" in v
                and isinstance(v.get("value"), int | float)
                and not isinstance(v["value"], bool)
                and math.isfinite(v["value"])
                for v in record["verdicts"]
            )
            and all(
                k in record for k in ("prompt_tokens", "completion_tokens", "latency_s", "attempts")
            )
        )
    except (KeyError, TypeError):
        return False
