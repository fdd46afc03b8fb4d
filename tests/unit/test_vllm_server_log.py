"""A starting vLLM server is never a silent wait: its stages, read from its log as vLLM
writes it, are told as they come, and a long stage is told again while it lasts.

The server here is a stand-in program (vLLM's log lines, then /health): what is under test
is tracerl's reading of the log, not vLLM. The real server's stages are checked in
tests/integration/test_vllm_engine.py."""

from __future__ import annotations

import sys
import textwrap

from tracerl.engines.server_log import StartupWatch
from tracerl.engines.vllm import ServerSettings, VLLMServer

LOAD = "(Worker pid=7) INFO 12-03 22:37:18 [cpu_model_runner.py:68] Starting to load model /m..."
COMPILED = (
    "(Worker pid=7) INFO [backends.py:398] Compiling a graph for compile range (1, 8) takes 9 s"
)
CACHED = (
    "(Worker pid=7) INFO [backends.py:295] Directly load the compiled graph(s) for compile range"
)
KV = "(EngineCore pid=6) INFO [kv_cache_utils.py:2327] CPU KV cache size: 524,288 tokens"


def test_stages_are_read_as_the_log_grows_and_only_move_forward(tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text("an earlier start's lines: Starting to load model /old\n")
    watch = StartupWatch(log)  # reads only what comes after
    assert watch.poll() == [] and watch.stage == "importing vLLM"
    with open(log, "a") as f:
        f.write(LOAD[:30])  # a line still being written is not read yet
        f.flush()
        assert watch.poll() == []
        f.write(LOAD[30:] + "\n" + COMPILED + "\n" + CACHED + "\n")
        f.flush()
        assert watch.poll() == [
            "loading the weights",
            "compiling graphs (once; cached for later starts)",
            "loading compiled graphs from the cache",
        ]
        f.write(LOAD + "\n" + KV + "\n")  # a stage seen before is not told again
        f.flush()
        assert watch.poll() == ["allocating the KV cache"]
    assert watch.compile == "compiled"  # one graph compiled: not a start from the cache


def test_a_start_from_the_compile_cache_says_so(tmp_path):
    log = tmp_path / "vllm.log"
    watch = StartupWatch(log)  # no log yet
    assert watch.poll() == []
    log.write_text(f"{LOAD}\n{CACHED}\n{KV}\n")
    assert watch.poll()[-1] == "allocating the KV cache"
    assert watch.compile == "cached"


FAKE_SERVER = """\
#!{python}
# vLLM's start, as its log shows it: stages, a long one, then the HTTP routes
import http.server, json, pathlib, sys, time

port = int(sys.argv[sys.argv.index("--port") + 1])
print({load!r}, flush=True)
go = pathlib.Path({go!r})
while not go.exists():  # the weights load until the test has heard the stage told again
    time.sleep(0.05)
print({compiled!r}, flush=True)
print({kv!r}, flush=True)


class Routes(http.server.BaseHTTPRequestHandler):
    def answer(self):
        body = json.dumps({{"ok": True}}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = answer

    def log_message(self, *args):
        pass


http.server.HTTPServer(("127.0.0.1", port), Routes).serve_forever()
"""


def test_a_starting_server_tells_each_stage_and_a_long_one_again(tmp_path, monkeypatch):
    go = tmp_path / "go"
    fake = tmp_path / "python"
    fake.write_text(
        textwrap.dedent(FAKE_SERVER).format(
            python=sys.executable, load=LOAD, compiled=COMPILED, kv=KV, go=str(go)
        )
    )
    fake.chmod(0o755)
    told: list[str] = []

    def on_stage(line: str) -> None:
        told.append(line)
        if line.startswith("vLLM: still loading the weights"):
            go.touch()

    monkeypatch.setattr(VLLMServer, "HEARTBEAT_S", 0.2)
    settings = ServerSettings(python=str(fake), start_timeout_s=120)
    server = VLLMServer(tmp_path, "m", settings, tmp_path / "vllm.log", on_stage=on_stage)
    try:
        url = server.start()
    finally:
        server.stop()
    assert url.startswith("http://127.0.0.1:")
    assert told[0] == f"vLLM: starting (its log: {server.log})"
    stages = [line.removeprefix("vLLM: ").rsplit(" (", 1)[0] for line in told[1:]]
    assert "still loading the weights" in stages  # the fake waited for it
    assert [s for s in stages if not s.startswith("still")] == [
        "loading the weights",
        "compiling graphs (once; cached for later starts)",
        "allocating the KV cache",
        "sampling a first token",
    ]
    assert all(line.endswith(" s)") for line in told[1:])  # each with the time it came
    assert server.compile == "compiled"
