"""`tracerl serve`: the OpenAI-compatible completion subset our remote sampler uses (and the
chat completions a model judge asks for), over an in-process Hugging Face model
(`BatchedHFSampler`: concurrent requests share a batch).

    POST /v1/completions   {"prompt": [token ids], "max_tokens", "temperature", "seed",
                            "stop_token_ids", "logprobs", "return_tokens_as_token_ids",
                            "prompt_logprobs"}
                           -> choices[0]: text, logprobs {tokens: ["token_id:<n>"],
                              token_logprobs}, finish_reason; and policy_version; with
                              prompt_logprobs (k >= 0), vLLM's prompt_logprobs: each
                              prompt token's log-prob and rank (and the top k's), at the
                              server's temperature (a teacher's scores: docs/distillation.md)
    POST /v1/chat/completions  {"messages": [{"role", "content"}], "max_tokens",
                           "temperature", "seed"} -> choices[0].message.content, usage: the
                           model's chat template applied, its reply up to its end-of-turn
                           token (what a model judge asks, `tracerl.engines.judge_client`)
    GET  /v1/models        the model this server serves
    GET  /health           200
    POST /v1/load_lora_adapter, /v1/unload_lora_adapter   {"lora_name", "lora_path"}
                           with --enable-lora: the adapter is served in place of the one
                           before, and answers carry its name and version (weight sync to a
                           server the learner does not own: `tracerl.rollout.weight_sync`)

So the remote path is tested end to end on a CPU, and a CPU box can serve a small policy to
remote rollout workers. The temperature is the server's: a request asking for another one is
refused (the log-probs would not be of the distribution it asked for).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import threading
import time
from collections.abc import Callable
from typing import Any

from tracerl.jsonhttp import JSONHandler, Server
from tracerl.rollout.sampler import SampleRequest

MAX_BODY = 16 << 20


class NotFound(Exception):
    """A model or adapter this server does not have: HTTP 404, as vLLM answers."""


class CompletionServer:
    def __init__(
        self, sampler: Any, model_name: str, tokenizer: Any = None, *, enable_lora: bool = False
    ) -> None:
        self.sampler = sampler
        self.base_name = model_name
        self.model_name = model_name  # what answers are sampled by: the newest adapter
        self.tokenizer = tokenizer
        self._chat_stops: frozenset[int] | None = None  # found once (a 49k-entry vocab scan)
        self.enable_lora = enable_lora
        self.adapters: set[str] = set()
        self.served = 0
        self._httpd: Server | None = None

    async def handle(self, method: str, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
        if method == "GET" and path == "/health":
            return 200, {"status": "ok"}
        if method == "GET" and path == "/v1/models":
            return 200, {"object": "list", "data": [{"id": self.model_name, "object": "model"}]}
        routes = {
            "/v1/completions": self.complete,
            "/v1/chat/completions": self.chat,
            "/v1/load_lora_adapter": self.load_lora,
            "/v1/unload_lora_adapter": self.unload_lora,
        }
        if method == "POST" and path in routes:
            if "lora" in path and not self.enable_lora:
                return 404, {"error": {"message": "start the server with --enable-lora"}}
            try:
                return 200, await routes[path](json.loads(body or b"{}"))
            except NotFound as e:  # a model this server does not have (as vLLM: 404)
                return 404, {"error": {"message": str(e), "type": "NotFoundError"}}
            except (ValueError, KeyError, TypeError, OSError) as e:
                return 400, {"error": {"message": str(e), "type": "invalid_request_error"}}
            except Exception as e:  # answered, never a dropped connection
                return 500, {"error": {"message": f"{type(e).__name__}: {e}"}}
        return 404, {"error": {"message": f"no route {method} {path}"}}

    def _check(self, req: dict[str, Any]) -> None:
        """The model asked for is served here, at this server's temperature."""
        name = req.get("model")
        if name is not None and name != self.base_name and name not in self.adapters:
            raise NotFound(f"the model {name!r} does not exist here; /v1/models lists it")
        temperature = float(req.get("temperature", self.sampler.temperature))
        if abs(temperature - self.sampler.temperature) > 1e-9:
            raise ValueError(
                f"this server samples at temperature {self.sampler.temperature}, "
                f"not {temperature}; start it with --temperature {temperature}"
            )

    async def chat(self, req: dict[str, Any]) -> dict[str, Any]:
        """A chat completion: the messages through the model's chat template, the reply
        sampled until the template's end of turn, decoded to text."""
        self._check(req)
        messages = req.get("messages")
        if (
            not isinstance(messages, list)
            or not all(
                isinstance(m, dict) and isinstance(m.get("content"), str) and m.get("role")
                for m in messages
            )
            or not messages
        ):
            raise ValueError("messages must be a non-empty list of {role, content} (text)")
        if self.tokenizer is None or not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"{self.base_name} has no chat template: use /v1/completions")
        ids: Any = self.tokenizer.apply_chat_template(
            [{"role": m["role"], "content": m["content"]} for m in messages],
            add_generation_prompt=True,
            tokenize=True,
        )
        if not isinstance(ids, list):  # a BatchEncoding (newer transformers)
            ids = list(ids["input_ids"])
        if self._chat_stops is None:
            self._chat_stops = _end_of_turn_ids(self.tokenizer)
        res = await self.sampler.sample(
            SampleRequest(
                tuple(ids),
                max_tokens=int(req.get("max_tokens") or 256),
                stop_token_ids=self._chat_stops,
                seed=req.get("seed"),
            )
        )
        self.served += 1
        text = self.tokenizer.decode(res.token_ids, skip_special_tokens=True)
        return {
            "id": f"chatcmpl-{self.served}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": res.finish_reason,
                }
            ],
            "usage": _usage(len(ids), len(res.token_ids)),
        }

    async def complete(self, req: dict[str, Any]) -> dict[str, Any]:
        self._check(req)
        if "prompt" not in req:
            raise ValueError("a completion request needs a prompt (token ids)")
        prompt = req["prompt"]
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
            if len(prompt) != 1:
                raise ValueError("one prompt per request")
            prompt = prompt[0]
        if not isinstance(prompt, list) or not all(isinstance(t, int) for t in prompt):
            raise ValueError("prompt must be a list of token ids (text is never re-tokenized)")
        request = SampleRequest(
            tuple(prompt),
            max_tokens=int(req.get("max_tokens", 16)),
            stop_token_ids=frozenset(req.get("stop_token_ids") or ()),
            seed=req.get("seed"),
        )
        scored = None
        if req.get("prompt_logprobs") is not None:  # a teacher scoring these ids
            top = int(req["prompt_logprobs"])
            if top < 0:
                raise ValueError("prompt_logprobs must be 0 or more (the top k beside each token)")
            scored = await asyncio.to_thread(self.sampler.prompt_logprobs, list(prompt), top)
        res = await self.sampler.sample(request)
        self.served += 1
        text = self.tokenizer.decode(res.token_ids) if self.tokenizer is not None else ""
        return {
            "id": f"cmpl-{self.served}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
            "policy_version": res.policy_version,
            "choices": [
                {
                    "index": 0,
                    "text": text,
                    "logprobs": {
                        "tokens": [f"token_id:{t}" for t in res.token_ids],
                        "token_logprobs": res.logprobs,
                    },
                    "finish_reason": res.finish_reason,
                    **({"prompt_logprobs": self._prompt_entries(scored)} if scored else {}),
                }
            ],
            "usage": _usage(len(prompt), len(res.token_ids)),
        }

    def _prompt_entries(self, scored: list[Any]) -> list[Any]:
        """vLLM's shape: None, then per position {"<id>": {logprob, rank, decoded_token}}."""

        def token(t: int) -> str:
            return self.tokenizer.decode([t]) if self.tokenizer is not None else f"token_id:{t}"

        return [
            None
            if entry is None
            else {
                str(t): {"logprob": lp, "rank": rank, "decoded_token": token(t)}
                for t, (lp, rank) in entry.items()
            }
            for entry in scored
        ]

    async def load_lora(self, req: dict[str, Any]) -> dict[str, Any]:
        """vLLM's adapter hot-load: here one adapter is served at a time, swapped in place
        (`load_adapter`); completions answer with its name and version whatever they ask."""
        from tracerl.rollout.weight_sync import load_adapter

        if "lora_name" not in req or "lora_path" not in req:
            raise ValueError("load_lora_adapter needs lora_name and lora_path")
        name, path = str(req["lora_name"]), str(req["lora_path"])
        if name in self.adapters or name == self.base_name:
            raise ValueError(f"the lora adapter {name!r} has already been loaded")
        version = await asyncio.to_thread(load_adapter, self.sampler, path, name)
        self.model_name = name
        self.adapters.add(name)
        return {"status": "ok", "lora_name": name, "policy_version": version}

    async def unload_lora(self, req: dict[str, Any]) -> dict[str, Any]:
        name = str(req.get("lora_name"))
        if name == self.model_name:
            raise ValueError(f"{name} is the adapter being served; load another one first")
        if name not in self.adapters:
            raise NotFound(f"no adapter {name!r} was loaded")
        self.adapters.discard(name)
        return {"status": "ok", "lora_name": name}

    async def start(self, host: str = "127.0.0.1", port: int = 8000) -> int:
        """Listen on `host`:`port` (0: any free port); returns the port. HTTP is the standard
        library's threaded server (as `serve-retriever`'s); each request is answered in this
        event loop, where the sampler batches the requests that wait together."""
        loop = asyncio.get_running_loop()
        self._httpd = Server((host, port), _handler(self, loop))
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self._httpd.server_address[1]

    async def stop(self) -> None:
        """Stop listening."""
        if self._httpd is not None:
            await asyncio.to_thread(self._httpd.shutdown)
            self._httpd.server_close()


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>")
"""Tokens that end an assistant's turn in common chat templates (ChatML, Llama 3, Phi,
Gemma): a chat reply stops at the first of them the tokenizer has, or at its EOS."""


def _end_of_turn_ids(tokenizer: Any) -> frozenset[int]:
    vocab = tokenizer.get_vocab()
    ids = {vocab[t] for t in END_OF_TURN if t in vocab}
    return frozenset((ids | {tokenizer.eos_token_id}) - {None})


class ServerThread:
    """A `CompletionServer` on an event loop of its own, in a daemon thread: the learner
    serves its live weights to remote rollout workers while its own loop trains. The
    sampler is the learner's, so a served turn carries the version that sampled it."""

    def __init__(
        self,
        sampler: Any,
        model_name: str,
        tokenizer: Any = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        advertise: str | None = None,
        enable_lora: bool = False,
    ) -> None:
        self.server = CompletionServer(sampler, model_name, tokenizer, enable_lora=enable_lora)
        self.host, self.port = host, port
        self.advertise = advertise or host
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="tracerl-serve", daemon=True
        )
        self.url: str | None = None

    def start(self) -> str:
        """Listen; returns the base URL rollout workers should use."""
        self._thread.start()
        bound = asyncio.run_coroutine_threadsafe(
            self.server.start(self.host, self.port), self._loop
        ).result()
        self.url = f"http://{self.advertise}:{bound}"
        return self.url

    def stop(self) -> None:
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result()
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
        self._loop.close()

    async def _shutdown(self) -> None:
        """Stop listening, then cancel what still runs here (the sampler's batching task,
        which the next loop to sample restarts)."""
        await self.server.stop()
        rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in rest:
            t.cancel()
        await asyncio.gather(*rest, return_exceptions=True)


def _handler(server: CompletionServer, loop: asyncio.AbstractEventLoop) -> type:
    class Handler(JSONHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: a client reuses its connection
        # headers and body are two writes: with Nagle's algorithm the body would wait for
        # the client's delayed ACK of the headers (~40 ms a request on Linux)
        disable_nagle_algorithm = True

        def _answer(self, method: str) -> None:
            n = int(self.headers.get("Content-Length", 0))
            if n > MAX_BODY:
                self.close_connection = True
                return self._send(413, {"error": {"message": "request body too large"}})
            body = self.rfile.read(n) if n else b""
            future = asyncio.run_coroutine_threadsafe(
                server.handle(method, self.path.split("?")[0], body), loop
            )
            try:
                answer = future.result()
            except concurrent.futures.CancelledError:  # the server stopped with it in flight
                self.close_connection = True
                answer = 503, {"error": {"message": "the server stopped", "type": "unavailable"}}
            self._send(*answer)

        def do_GET(self) -> None:
            self._answer("GET")

        def do_POST(self) -> None:
            self._answer("POST")

    return Handler


def serve_model(
    bundle: Any,
    name: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    temperature: float = 1.0,
    max_batch_size: int = 16,
    enable_lora: bool = False,
    kv_cache: str = "dynamic",
    compile: bool = False,
    log: Callable[[str], None] = print,
) -> None:
    """Serve a loaded model (`tracerl.models.load`) as `name` until interrupted (Ctrl-C):
    the completion subset and chat completions (`tracerl serve`). `log` is told the URL."""
    from tracerl.rollout import BatchedHFSampler

    sampler = BatchedHFSampler(
        bundle.model,
        temperature=temperature,
        max_batch_size=max_batch_size,
        kv_cache=kv_cache,
        compile=compile,
    )
    server = CompletionServer(sampler, name, bundle.tokenizer, enable_lora=enable_lora)

    async def main() -> None:
        bound = await server.start(host, port)
        log(f"serving {name} on http://{host}:{bound}/v1/completions")
        await asyncio.Event().wait()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
