"""Every client of an OpenAI-compatible server (`tracerl.rollout.endpoints`) takes its URL
the same way: the SDK's ``base_url`` (``http://host:8000/v1``, or a provider's own path) as
given, and a bare server root (``http://host:8000``) with ``/v1`` added, as the sampler
already did. A URL that is not one is refused when the config is read, naming the field. An
API key variable a config names but the environment lacks stops the run before it starts,
for the summarizer as for the judge and the teacher."""

from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from tests.command import run_tracerl
from tracerl.config.distill import TeacherServer
from tracerl.rollout.context.config import SummarizerConfig
from tracerl.rollout.endpoints import openai_base_url, server_root
from tracerl.train.distill.server import ServerTeacher

CASES = [
    ("http://127.0.0.1:8000", "http://127.0.0.1:8000/v1"),
    ("http://127.0.0.1:8000/", "http://127.0.0.1:8000/v1"),
    ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1"),
    (" http://127.0.0.1:8000/v1/ ", "http://127.0.0.1:8000/v1"),
    ("https://openrouter.ai/api/v1", "https://openrouter.ai/api/v1"),
    ("https://host/v1beta/openai", "https://host/v1beta/openai"),
]


@pytest.mark.parametrize(("given", "base"), CASES)
def test_the_base_url_of_each_form(given, base):
    assert openai_base_url(given) == base


@pytest.mark.parametrize(("given", "base"), CASES[:4])
def test_the_sampler_reads_the_same_server_from_either_form(given, base):
    assert server_root(given) + "/v1" == base


@pytest.mark.parametrize(("given", "base"), CASES[:4])
def test_the_teacher_and_the_summarizer_post_where_the_sampler_does(given, base):
    assert TeacherServer(base_url=given, model="m").base_url == base
    assert ServerTeacher(given, "m").url == base + "/completions"
    summarizer = SummarizerConfig(by="endpoint", base_url=given, model="m")
    assert summarizer.base_url == base


@pytest.mark.parametrize("bad", ["not a url", "ftp://host/v1", "http://", "http://host:0/v1"])
def test_a_url_that_is_not_a_servers_is_refused_naming_the_field(bad):
    with pytest.raises(ValidationError, match="base_url"):
        TeacherServer(base_url=bad, model="m")
    with pytest.raises(ValidationError, match="base_url"):
        SummarizerConfig(by="endpoint", base_url=bad, model="m")
    with pytest.raises(ValueError, match="http"):
        openai_base_url(bad)


def test_a_summarizer_key_the_environment_lacks_stops_the_run_before_the_model_loads(tmp_path):
    summarizer = {"by": "endpoint", "base_url": "http://127.0.0.1:9", "model": "m"}
    context = {"policy": "compact", "summarizer": {**summarizer, "api_key_env": "NO_SUCH_KEY_X"}}
    cfg = {"name": "s", "model": {"spec": "tiny-random"}, "rollout": {"context": context}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    r = run_tracerl(["train", "c.yaml"], tmp_path, tmp_path / "cache")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 2, r.stderr
    assert "rollout.context.summarizer: the environment variable NO_SUCH_KEY_X" in lines[0]
    assert lines[1].strip().startswith("export NO_SUCH_KEY_X=")
    assert not (tmp_path / "runs").exists()  # nothing written
