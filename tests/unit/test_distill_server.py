"""A teacher behind a server (``trainer.distill.server``): ``tracerl serve``'s prompt log-probs
equal the in-process teacher's on the same trajectories; a server that ignores the
temperature is refused; an outage is retried, and a sample it never answers is unscored
(the evaluator's), never a zero."""

from __future__ import annotations

import copy
import json

import httpx
import pytest

from tests.unit.test_distill import T, rows  # noqa: F401  (the fixture)
from tracerl.errors import UserError
from tracerl.rollout import BatchedHFSampler
from tracerl.rollout.serve import CompletionServer, ServerThread
from tracerl.train.distill import Distiller, ModelTeacher
from tracerl.train.distill.server import ServerTeacher


@pytest.fixture(scope="module")
def student():
    from tracerl.models import load

    return load("tiny-random")


def serve(model, tokenizer, server_cls=CompletionServer, temperature=T):
    thread = ServerThread(BatchedHFSampler(model, temperature=temperature), "teacher", tokenizer)
    thread.server = server_cls(thread.server.sampler, "teacher", tokenizer)
    return thread


def test_the_servers_prompt_logprobs_are_the_in_process_teachers(student, rows):  # noqa: F811
    model = copy.deepcopy(student.model)
    thread = serve(model, student.tokenizer)
    url = thread.start()
    try:
        remote = ServerTeacher(url + "/v1", "teacher")
        remote.check(rows[0].token_ids, T)  # tracerl serve applies its temperature
        got = Distiller(remote, temperature=T, outcome_weight=0.0).apply(rows, [0.0] * 3)
        raw = httpx.post(
            url + "/v1/completions",
            json={"prompt": rows[0].token_ids[:6], "max_tokens": 1, "prompt_logprobs": 2},
        ).json()["choices"][0]["prompt_logprobs"]
    finally:
        thread.stop()
    local = ModelTeacher(copy.deepcopy(student.model), "same", "same")
    want = Distiller(local, temperature=T, outcome_weight=0.0).apply(rows, [0.0] * 3)
    assert got.keep == want.keep == [0, 1, 2]
    for a, b in zip(got.advantages, want.advantages, strict=True):
        assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-4
    assert raw[0] is None and len(raw) == 6
    ids = rows[0].token_ids
    for i in range(1, 6):  # vLLM's shape: the token there, with its rank, and the top 2
        assert str(ids[i]) in raw[i] and raw[i][str(ids[i])]["rank"] >= 1
        assert 2 <= len(raw[i]) <= 3
        assert {e["rank"] for e in raw[i].values()} >= {1, 2}


def test_a_server_whose_prompt_logprobs_ignore_the_temperature_is_refused(student, rows):  # noqa: F811
    class Raw(CompletionServer):
        async def complete(self, req):
            req = {**req, "temperature": self.sampler.temperature}
            out = await super().complete(req)
            return out

    thread = serve(copy.deepcopy(student.model), student.tokenizer, Raw, temperature=1.0)
    url = thread.start()
    try:
        with pytest.raises(UserError, match="ignore the temperature"):
            ServerTeacher(url + "/v1", "teacher").check(rows[0].token_ids, T)
    finally:
        thread.stop()


def test_an_outage_is_retried_and_a_sample_never_answered_is_unscored(student, rows):  # noqa: F811
    class Flaky(CompletionServer):
        fails = 1  # the first request: a 503, retried

        async def handle(self, method, path, body):
            if path == "/v1/completions":
                if Flaky.fails:
                    Flaky.fails -= 1
                    return 503, {"error": {"message": "overloaded"}}
                if len(json.loads(body)["prompt"]) == len(rows[1].token_ids):
                    return 500, {"error": {"message": "teacher crashed"}}
            return await super().handle(method, path, body)

    thread = serve(copy.deepcopy(student.model), student.tokenizer, Flaky)
    url = thread.start()
    try:
        teacher = ServerTeacher(url + "/v1", "teacher", retries=1, sleep=lambda _: None)
        d = Distiller(teacher, temperature=T).apply(rows, [0.0] * 3)
    finally:
        thread.stop()
    assert Flaky.fails == 0 and d.keep == [0, 2]
    assert d.metrics["train/distill/teacher_failures"] == 1.0
    # the probe (a 503, retried; then at temperature 1, refused: it answers at its own),
    # three rows, row 1's retry
    assert teacher.requests == 2 + 1 + 3 + 1


def test_a_server_that_is_not_there_stops_the_run_before_scoring_or_leaves_samples_out(
    rows,  # noqa: F811
):
    teacher = ServerTeacher("http://127.0.0.1:9/v1", "teacher", retries=0, timeout_s=2)
    with pytest.raises(UserError, match="did not score a probe"):
        Distiller(teacher, temperature=T).apply(rows, [0.0] * 3)  # before its first scores
    teacher.checked = True  # it answered once, then went away: those samples are unscored
    d = Distiller(teacher, temperature=T).apply(rows, [0.0] * 3)
    assert d.keep == [] and d.metrics["train/distill/teacher_failures"] == 3.0


def test_a_server_of_another_vocabulary_is_refused(student, rows):  # noqa: F811
    from tracerl.models.loading import char_tokenizer

    thread = serve(copy.deepcopy(student.model), student.tokenizer)
    url = thread.start()
    try:
        teacher = ServerTeacher(url + "/v1", "teacher", tokenizer=char_tokenizer())
        with pytest.raises(UserError, match="another vocabulary"):
            Distiller(teacher, temperature=T).apply(rows, [0.0] * 3)
    finally:
        thread.stop()
