"""Scale-out settings a run cannot use are told before the model loads, naming their key:
a Ray cluster that cannot be joined (``trainer.rollout.address``), a sampling server nothing
answers at (``trainer.rollout.sampler_url``, given with or without ``/v1``), a vLLM Python
without vllm (``model.vllm.python``). What preflight cannot see (a cluster that goes away
in between, workers that cannot reach the server from their node) is a `UserError` too when
the run meets it. No Ray cluster and no vLLM server is started here."""

from __future__ import annotations

import asyncio
import http.server
import socket
import stat
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest

from tracerl.config import ConfigError, RolloutBackendConfig
from tracerl.config.loading import load_config
from tracerl.engines.vllm_python import EngineError, check_vllm_python, find_vllm_python
from tracerl.errors import UserError
from tracerl.preflight import prepare, reach
from tracerl.rollout import ray_workers as rw
from tracerl.rollout.remote import RemoteSampler
from tracerl.rollout.sampler import SampleRequest

BASE = "configs/learn-arithmetic.yaml"
RAY = ["trainer.rollout.backend=ray"]


def closed_port() -> int:
    """A port of 127.0.0.1 that nothing listens on (bound, then let go)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def http_server(models_status: int):
    """An HTTP/1.1 server on 127.0.0.1 answering ``GET /v1/models`` with `models_status`
    (and 404 to anything else): a web server, not a Ray cluster."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            status = models_status if self.path == "/v1/models" else 404
            body = b'{"object": "list", "data": []}' if status == 200 else b""
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(autouse=True)
def ray_not_started(monkeypatch):
    """This process is not connected to Ray (a test beside these may have been)."""
    import ray

    monkeypatch.setattr(ray, "is_initialized", lambda: False)


@pytest.fixture
def no_ray_around(monkeypatch, tmp_path):
    """``auto`` finds nothing: no $RAY_ADDRESS, no recorded cluster, no raylet here."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "raytmp"))
    monkeypatch.setattr(reach, "local_raylet_addresses", lambda: [])
    return tmp_path / "raytmp" / "ray" / "ray_current_cluster"


# --- trainer.rollout.address ------------------------------------------------------------


def test_a_ray_address_nothing_listens_at_is_refused_before_anything_loads():
    address = f"127.0.0.1:{closed_port()}"
    cfg = load_config(BASE, [*RAY, f"trainer.rollout.address={address}"])
    with pytest.raises(ConfigError) as e:
        prepare(cfg)
    assert e.value.message.startswith("trainer.rollout.address: cannot join the Ray cluster")
    assert address in e.value.message and "refused the connection" in e.value.message
    assert "ray start --head" in e.value.hint and "unset" in e.value.hint


def test_a_run_without_its_workers_does_not_reach_for_them():
    """An evaluation of a Ray run's config samples in process: its cluster and server may
    be down (`prepare(cfg, workers=False)`)."""
    port = closed_port()
    cfg = load_config(
        BASE,
        [
            *RAY,
            f"trainer.rollout.address=127.0.0.1:{port}",
            f"trainer.rollout.sampler_url=http://127.0.0.1:{port}",
            "model.lora={}",
        ],
    )
    assert prepare(cfg, workers=False).cfg.trainer.rollout.address == f"127.0.0.1:{port}"


@pytest.mark.parametrize("scheme", ["", "ray://"])
def test_a_ray_address_where_a_web_server_answers_is_refused(scheme):
    """Something listens, but it is not a Ray cluster (a proxy that accepts every
    connection, another service's port): the gRPC health check a Ray head answers fails."""
    refused = r"trainer\.rollout\.address: .*is not a Ray cluster"
    with http_server(404) as where, pytest.raises(ConfigError, match=refused):
        reach.check_ray_address(scheme + where)


def test_an_address_that_is_not_host_port_is_refused():
    with pytest.raises(ConfigError, match=r"not an address Ray can join: give host:port"):
        reach.check_ray_address("10.0.0.1")


def test_no_address_and_local_start_a_cluster_of_the_runs_own(no_ray_around):
    reach.check_ray_address(None)
    reach.check_ray_address("local")


def test_auto_with_no_cluster_to_find_is_refused(no_ray_around):
    cfg = load_config(BASE, [*RAY, "trainer.rollout.address=auto"])
    with pytest.raises(ConfigError) as e:
        prepare(cfg)
    assert e.value.message.startswith(
        "trainer.rollout.address: cannot join the Ray cluster at 'auto': no running Ray "
        "cluster was found"
    )
    assert str(no_ray_around) in e.value.message and "ray start --head" in e.value.hint


def test_auto_checks_the_cluster_ray_would_find(no_ray_around, monkeypatch):
    gone = f"127.0.0.1:{closed_port()}"
    no_ray_around.parent.mkdir(parents=True)
    no_ray_around.write_text(gone + "\n")  # `ray start` recorded it; it has stopped since
    with pytest.raises(ConfigError, match=r"at '127\.0\.0\.1:\d+' \(auto: the cluster `ray start`"):
        reach.check_ray_address("auto")
    monkeypatch.setenv("RAY_ADDRESS", gone)  # the variable comes first, as in Ray
    with pytest.raises(ConfigError, match=r"\(auto: \$RAY_ADDRESS\): .*refused the connection"):
        reach.check_ray_address("auto")
    monkeypatch.setenv("RAY_ADDRESS", "local")  # Ray starts one of its own
    reach.check_ray_address("auto")
    monkeypatch.delenv("RAY_ADDRESS")
    no_ray_around.unlink()
    monkeypatch.setattr(reach, "local_raylet_addresses", lambda: ["10.0.0.7:6379"])
    reach.check_ray_address("auto")  # a raylet runs here: Ray joins its cluster


def test_the_ray_address_file_is_where_ray_start_records_it(monkeypatch):
    monkeypatch.delenv("RAY_TMPDIR", raising=False)
    monkeypatch.delenv("TMPDIR", raising=False)
    assert reach.ray_address_file() == Path("/tmp/ray/ray_current_cluster")
    monkeypatch.setenv("TMPDIR", "/scratch")
    assert reach.ray_address_file() == Path("/scratch/ray/ray_current_cluster")
    monkeypatch.setenv("RAY_TMPDIR", "/raytmp")
    assert reach.ray_address_file() == Path("/raytmp/ray/ray_current_cluster")


def test_a_cluster_that_cannot_be_joined_when_the_run_starts_is_a_user_error(monkeypatch):
    """What preflight could not see (a cluster gone since, a port that answers but is no
    GCS): Ray's ConnectionError becomes the same two lines, still a ConnectionError."""
    import ray

    def refuse(address=None, **kwargs):
        raise ConnectionError(f"Failed to connect to Ray cluster at {address}")

    monkeypatch.setattr(ray, "init", refuse)
    settings = RolloutBackendConfig(backend="ray", address="10.0.0.7:6379")
    with pytest.raises(rw.RayClusterError) as e:
        rw.RayRollouts(None, "http://127.0.0.1:1", settings=settings)
    assert isinstance(e.value, UserError) and isinstance(e.value, ConnectionError)
    assert e.value.message == (
        "trainer.rollout.address: cannot join the Ray cluster at '10.0.0.7:6379': "
        "ConnectionError: Failed to connect to Ray cluster at 10.0.0.7:6379"
    )
    assert "ray start --head" in e.value.hint


def test_workers_that_did_not_start_are_a_user_error_that_is_still_a_runtime_error(monkeypatch):
    import ray

    class Handle:
        class ready:
            @staticmethod
            def remote():
                return None

    class Actor:
        def options(self, **kwargs):
            return self

        def remote(self, *args):
            return Handle()

    def get(refs, timeout=None):
        raise RuntimeError(
            "rollout worker 0 on 10.0.0.7 cannot sample from http://gpu:8000 "
            "(SamplerUnavailable: ...)"
        )

    class Policy:
        renderer, parser, model_id = None, None, "m"

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "remote", lambda cls: Actor())
    monkeypatch.setattr(ray, "put", lambda x: x)
    monkeypatch.setattr(ray, "get", get)
    monkeypatch.setattr(ray, "kill", lambda *a, **k: None)
    with pytest.raises(rw.RolloutWorkersError) as e:
        rw.RayRollouts(Policy(), "http://gpu:8000", settings=RolloutBackendConfig(workers=1))
    assert isinstance(e.value, UserError) and isinstance(e.value, RuntimeError)
    assert str(e.value).startswith("Ray rollout workers did not start: rollout worker 0")
    assert "trainer.rollout.sampler_url" in e.value.hint


# --- trainer.rollout.sampler_url --------------------------------------------------------


def test_a_sampler_url_nothing_answers_at_is_refused_before_anything_loads():
    url = f"http://127.0.0.1:{closed_port()}/v1"
    cfg = load_config(BASE, [*RAY, f"trainer.rollout.sampler_url={url}", "model.lora={}"])
    with pytest.raises(ConfigError) as e:
        prepare(cfg)
    assert e.value.message.startswith("trainer.rollout.sampler_url: no server answers at ")
    assert "refused the connection" in e.value.message
    assert "tracerl serve MODEL --port" in e.value.hint and "fix the URL" in e.value.hint


def test_a_sampler_url_where_no_openai_server_answers_is_refused():
    refused = r"is not an OpenAI-compatible server: GET .*404"
    with http_server(404) as where, pytest.raises(ConfigError, match=refused):
        reach.check_sampler_url(f"http://{where}")
    with http_server(200) as where:  # lists its models: the workers' start-up check goes on
        reach.check_sampler_url(f"http://{where}")
    with http_server(401) as where:  # wants a key: not this check's to judge
        reach.check_sampler_url(f"http://{where}")


@pytest.mark.parametrize(
    "given",
    ["http://gpu:8000", "http://gpu:8000/", "http://gpu:8000/v1", "http://gpu:8000/v1/"],
)
def test_a_sampler_url_works_with_or_without_v1(given):
    """The OpenAI SDK's base_url form (``.../v1``) and the server's root are the same
    server: the requests go to ``/v1/completions`` once, not ``/v1/v1/completions``."""
    cfg = load_config(
        BASE, [*RAY, f"trainer.rollout.sampler_url={given}", "trainer.rollout.weight_sync=m:f"]
    )
    assert cfg.trainer.rollout.sampler_url == "http://gpu:8000"
    posted = []

    class Client:
        async def post(self, url, json):
            posted.append(url)
            raise RuntimeError("stop here")

    sampler = RemoteSampler(cfg.trainer.rollout.sampler_url, "m", client=Client())
    with pytest.raises(RuntimeError, match="stop here"):
        asyncio.run(sampler.sample(SampleRequest((0,), 1, seed=0)))
    assert posted == ["http://gpu:8000/v1/completions"]


@pytest.mark.parametrize("bad", ["gpu:8000", "ftp://gpu/v1", "http:///v1", "http://gpu:port"])
def test_a_sampler_url_that_is_no_http_url_is_refused_naming_the_key(bad):
    with pytest.raises(ConfigError, match=r"trainer\.rollout\.sampler_url: not an http\(s\) URL"):
        load_config(BASE, [*RAY, f"trainer.rollout.sampler_url={bad}", "model.lora={}"])


# --- model.vllm.python ------------------------------------------------------------------


def _script(path: Path, text: str) -> str:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_a_vllm_python_without_vllm_is_refused_before_anything_loads(tmp_path):
    """This interpreter has no vllm (the trainer's venv never does): preflight says so,
    naming the key, where before it only checked that the file was there."""
    python = sys.executable
    cfg = load_config(BASE, ["model.engine=vllm", f"model.vllm.python={python}"])
    with pytest.raises(EngineError) as e:
        prepare(cfg)
    assert e.value.message == f"model.vllm.python={python}: vllm is not installed in that Python"
    assert "make vllm" in e.value.hint and "pip install" in e.value.hint


def test_a_vllm_python_is_checked_where_it_came_from(tmp_path, monkeypatch):
    not_run = tmp_path / "python"
    not_run.write_text("")
    assert find_vllm_python(str(not_run)) == str(not_run)  # still cheap: the file is there
    with pytest.raises(EngineError, match=r"^model\.vllm\.python=.*: not executable$"):
        check_vllm_python(str(not_run))
    shell = _script(tmp_path / "sh", "#!/bin/sh\necho 'sh: no such option' >&2\nexit 2\n")
    with pytest.raises(EngineError, match=r"does not run as a Python \(sh: no such option\)"):
        check_vllm_python(shell)
    monkeypatch.setenv("TRACERL_VLLM_PYTHON", sys.executable)
    with pytest.raises(EngineError, match=r"^\$TRACERL_VLLM_PYTHON=.*: vllm is not installed"):
        check_vllm_python()


def test_a_python_that_has_vllm_passes_without_importing_it(tmp_path, monkeypatch):
    site = tmp_path / "site"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("raise SystemExit('imported: too slow')\n")
    python = _script(
        tmp_path / "python", f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} "$@"\n'
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "trainer-only"))  # not passed on
    assert check_vllm_python(python) == python


@pytest.mark.parametrize("given", ["http://gpu:8000", "http://gpu:8000/v1", "http://gpu:8000/v1/"])
def test_the_python_apis_take_a_servers_url_either_way_too(given):
    """`RemoteSampler` and the LoRA weight sync, built from Python with the OpenAI SDK's
    base_url form: their routes are the server's, once."""
    from tracerl.rollout.weight_sync import LoraAdapterSync

    posted = []

    class Client:
        async def post(self, url, json):
            posted.append(url)
            raise RuntimeError("stop here")

    sampler = RemoteSampler(given, "m", client=Client())
    with pytest.raises(RuntimeError, match="stop here"):
        asyncio.run(sampler.sample(SampleRequest((0,), 1, seed=0)))
    assert posted == ["http://gpu:8000/v1/completions"]
    assert LoraAdapterSync(given, "m", "/tmp").base_url == "http://gpu:8000"
