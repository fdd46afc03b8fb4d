"""Use a `tracerl export` the way anyone would: its chat template renders the tools, a model
answers, your code runs the calls and scores the answer. No tracerl runner in the loop.

    python examples/serve_export.py EXPORT --env unitconv.env:UnitConv --split test --n 16
    python examples/serve_export.py EXPORT --env ... --server http://127.0.0.1:8000/v1

Two ways to serve the same folder:

* ``transformers`` (the default): ``tokenizer.apply_chat_template(messages, tools=tools,
  add_generation_prompt=True)``, ``model.generate`` with the export's
  ``generation_config.json`` (greedy here), the calls read in the format the export's
  ``tracerl_export.json`` names (``parser``);
* an OpenAI-compatible server (``--server``): ``vllm serve EXPORT`` with the tool-call
  parser the export's model card names; the server renders the tools and parses the calls.

Each episode follows the protocol the run trained in (its model card says it): the
environment's first messages, its tools, at most ``steps`` model turns, each call answered by
a ``tool`` message, and the run's reserve instruction as a user turn when one turn is left
after a tool step. What a turn saw (its prompt's token ids) and wrote is kept, so a test can
compare them with the run's own episodes token for token.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Turn:
    prompt_ids: list[int]
    """The token ids the model was given for this turn (as the serving side rendered them)."""
    text: str
    """What it wrote (its calls included; the stop token left out)."""
    calls: list[dict[str, Any]]
    """The calls read from it: ``{"id", "name", "arguments"}``."""
    error: str | None = None
    """Why its calls could not be read (a malformed call), if so."""
    cut: bool = False
    """The turn hit the token limit before its stop token."""
    logprobs: list[float] | None = None
    """Each written token's log-probability (its stop token's included), as served."""


@dataclass
class Played:
    task_id: str
    answer: str | None
    turns: list[Turn] = field(default_factory=list)


class TransformersChat:
    """The export in plain transformers: its chat template, its generation config, greedy."""

    def __init__(self, folder: str | Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

        from tracerl.envs.parsers import get_parser

        folder = Path(folder)
        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        self.generation = GenerationConfig.from_pretrained(folder)
        # greedy, with the export's stop ids and turn length (its sampling is the run's)
        self.greedy = GenerationConfig.from_dict(
            {
                **self.generation.to_dict(),
                "do_sample": False,
                "temperature": 1.0,
                "top_p": 1.0,
                "output_logits": True,  # each written token's log-prob, to compare
                "return_dict_in_generate": True,
            }
        )
        meta = json.loads((folder / "tracerl_export.json").read_text())
        self.parser = get_parser(meta["parser"])
        eos = self.generation.eos_token_id
        self.stop_ids = set(eos if isinstance(eos, list) else [eos])

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            messages, tools=tools or None, add_generation_prompt=True, tokenize=False
        )
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def __call__(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], step: int
    ) -> Turn:
        ids = self.prompt_ids(messages, tools)
        with self.torch.no_grad():
            out = self.model.generate(
                input_ids=self.torch.tensor([ids]),
                attention_mask=self.torch.ones(1, len(ids), dtype=self.torch.long),
                generation_config=self.greedy,
            )
        new, cut = out.sequences[0, len(ids) :].tolist(), True
        logprobs = [
            float(self.torch.log_softmax(logits[0].float(), -1)[t])
            for logits, t in zip(out.logits, new, strict=False)
        ]
        for i, t in enumerate(new):
            if t in self.stop_ids:
                new, cut, logprobs = new[:i], False, logprobs[: i + 1]
                break
        text = self.tokenizer.decode(new, skip_special_tokens=False)
        action = self.parser.parse(text, step=step)
        calls = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in action.tool_calls]
        error = action.error.message if action.error is not None else None
        return Turn(ids, text, calls, error, cut, logprobs)


class ServerChat:
    """An OpenAI-compatible server (``vllm serve EXPORT --enable-auto-tool-choice ...``):
    it renders the tools with the export's template and parses the calls itself."""

    def __init__(self, base_url: str, model: str, max_tokens: int) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.max_tokens = model, max_tokens

    def __call__(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], step: int
    ) -> Turn:
        import httpx

        body = {
            "model": self.model,
            "messages": messages,
            "temperature": 0.0,
            "max_tokens": self.max_tokens,
            "return_token_ids": True,  # vLLM: the prompt's ids, to compare with the run's
            "skip_special_tokens": False,
            "logprobs": True,
        }
        if tools:
            body.update(tools=tools, tool_choice="auto")
        r = httpx.post(self.url, json=body, timeout=300)
        r.raise_for_status()
        answer = r.json()
        choice = answer["choices"][0]["message"]
        calls = [
            {
                "id": c["id"],
                "name": c["function"]["name"],
                "arguments": json.loads(c["function"]["arguments"] or "{}"),
            }
            for c in choice.get("tool_calls") or []
        ]
        cut = answer["choices"][0].get("finish_reason") == "length"
        text = choice.get("content") or ""
        scored = (answer["choices"][0].get("logprobs") or {}).get("content") or []
        logprobs = [float(x["logprob"]) for x in scored]
        ids = list(answer.get("prompt_token_ids") or [])
        return Turn(ids, text, calls, cut=cut, logprobs=logprobs)


Chat = Callable[[list[dict[str, Any]], list[dict[str, Any]], int], Turn]


async def play(
    env: Any,
    task: dict[str, Any],
    chat: Chat,
    *,
    steps: int,
    tool_calls: int | None = None,
    finalize_at: int | None = 1,
    instruction: str | None = None,
    seed: int = 0,
    assistant_calls: bool = False,
    max_parse_errors: int = 3,
) -> Played:
    """One episode of `task`: `chat` answers, `env` runs the calls. When a tool step leaves
    `finalize_at` turns or fewer, or spends the last of `tool_calls`, `instruction` is said
    once (the run's reserve; None: never).
    `assistant_calls`: the assistant message carries its calls as OpenAI ``tool_calls``
    (a server's answer) rather than as the text the model wrote (transformers)."""
    from tracerl.envs.parsers import Action
    from tracerl.types import ToolCall

    messages = [dict(m) for m in await env.reset(task, seed)]
    tools = env.tool_schemas()
    played = Played(str(task.get("id")), None)
    announced, errors, used = False, 0, 0
    try:
        for step in range(steps):
            turn = chat(messages, tools, step)
            played.turns.append(turn)
            if turn.error is not None:  # shown to the model, as the run did
                errors += 1
                if errors >= max_parse_errors:
                    return played
                messages.append({"role": "assistant", "content": turn.text})
                note = f"Your last message could not be read ({turn.error})."
                messages.append({"role": "user", "content": note})
                continue
            if not turn.calls:
                if turn.cut:  # an answer cut off by the token limit is no answer
                    return played
                played.answer = turn.text.strip()
                await env.step(Action(text=turn.text, answer=played.answer))
                return played
            calls = [ToolCall(c["id"], c["name"], c["arguments"]) for c in turn.calls]
            message: dict[str, Any] = {"role": "assistant", "content": turn.text}
            if assistant_calls:
                message["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
                    }
                    for c in calls
                ]
            messages.append(message)
            result = await env.step(Action(text=turn.text, tool_calls=tuple(calls)))
            messages += [dict(m) for m in result.messages]
            if result.terminated or result.truncated:
                return played
            used += len(calls)
            left = steps - step - 1
            spent = tool_calls is not None and used >= tool_calls
            due = spent or (finalize_at is not None and left <= finalize_at)
            if instruction and due and left > 0 and not announced:
                announced = True
                messages.append({"role": "user", "content": instruction})
        return played
    finally:
        await env.close()


def play_all(
    make_env: Callable[[], Any], tasks: list[dict[str, Any]], chat: Chat, **kwargs: Any
) -> list[Played]:
    async def go() -> list[Played]:
        return [await play(make_env(), t, chat, **kwargs) for t in tasks]

    return asyncio.run(go())


def run_turns(trajectory: Any, stop_ids: set[int], decode: Callable[[list[int]], str]) -> list:
    """A run's episode as `Turn`s: each policy turn's prompt (every token before it) and
    its text (the stop token left out), to compare a served episode with, token for token."""
    ids: list[int] = []
    turns = []
    for s in trajectory.segments:
        if s.source.value == "policy":
            own = list(s.token_ids)
            if own and own[-1] in stop_ids:
                own = own[:-1]
            turns.append(Turn(list(ids), decode(own), [], logprobs=list(s.logprobs or ())))
        ids += list(s.token_ids)
    return turns


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("export", type=Path)
    ap.add_argument("--env", required=True, help="the environment (a name or module:Class)")
    ap.add_argument("--split", default="test")
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0, help="the task sample's seed")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--server", help="an OpenAI-compatible base URL (vllm serve EXPORT)")
    args = ap.parse_args()

    from tracerl.envs import make

    chat: Chat
    if args.server:
        chat = ServerChat(args.server, str(args.export), max_tokens=64)
    else:
        chat = TransformersChat(args.export)
    tasks = make(args.env).sample_tasks(args.n, seed=args.seed, split=args.split)
    for p in play_all(lambda: make(args.env), tasks, chat, steps=args.steps):
        print(f"{p.task_id}: {len(p.turns)} turns, answer {p.answer!r}")


if __name__ == "__main__":
    main()
