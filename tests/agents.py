"""Agents written only with the openai SDK, as their authors would write them: no tracerl
import. The gateway tests train and break them (`tracerl.gateway`)."""

from __future__ import annotations

import asyncio
import json
import time

SYSTEM = "You add numbers with the add tool, then give the sum."
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "additionalProperties": False,
                "properties": {
                    "a": {"description": "the first integer.", "type": "integer"},
                    "b": {"description": "the second integer.", "type": "integer"},
                },
                "required": ["a", "b"],
                "type": "object",
            },
        },
    }
]


def question(task):
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"What is {task['a']} + {task['b']}?"},
    ]


def add(a, b):
    return str(a + b)


async def solve(task, client):
    """The openai SDK's tool loop: call the model, run the tools it asks for, repeat."""
    messages = question(task)
    for _ in range(10):
        response = await client.chat.completions.create(
            model="policy", messages=messages, tools=TOOLS
        )
        message = response.choices[0].message
        if not message.tool_calls:
            return message.content
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            args = json.loads(call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": add(**args)})
    return None


def solve_sync(task, client):
    """The same loop with the synchronous client."""
    messages = question(task)
    for _ in range(10):
        message = (
            client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
            .choices[0]
            .message
        )
        if not message.tool_calls:
            return message.content
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            args = json.loads(call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": add(**args)})
    return None


async def solve_streaming(task, client):
    """One streamed request: the answer's text, assembled from its chunks."""
    stream = await client.chat.completions.create(
        model="policy", messages=question(task), stream=True
    )
    parts = []
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
    return "".join(parts)


async def arithmetic(task, client):
    """One question, one answer: `tracerl.envs.arithmetic` asked through the SDK."""
    response = await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": f"{task['a']}+{task['b']}="}]
    )
    return response.choices[0].message.content


# ---- harnesses that rewrite their history ---------------------------------------------------


async def _first_round(task, client):
    """Ask, run the model's tool calls: the messages so far (with the tool results)."""
    messages = question(task)
    response = await client.chat.completions.create(model="p", messages=messages, tools=TOOLS)
    message = response.choices[0].message
    messages.append(message.model_dump(exclude_none=True))
    for call in message.tool_calls or ():
        args = json.loads(call.function.arguments)
        messages.append({"role": "tool", "tool_call_id": call.id, "content": add(**args)})
    return messages


async def drops_message(task, client):
    """Memory trimming: drops the system prompt before asking again."""
    messages = await _first_round(task, client)
    r = await client.chat.completions.create(model="p", messages=messages[1:], tools=TOOLS)
    return r.choices[0].message.content


async def edits_tool_output(task, client):
    """Rewrites the tool result it already sent (a summarizing harness)."""
    messages = await _first_round(task, client)
    await client.chat.completions.create(model="p", messages=messages, tools=TOOLS)
    messages[-1] = {**messages[-1], "content": "the sum is " + messages[-1]["content"]}
    r = await client.chat.completions.create(model="p", messages=messages, tools=TOOLS)
    return r.choices[0].message.content


async def strips_thinking(task, client):
    """Drops the model's <think> block from its earlier answer (as many harnesses do)."""
    messages = question(task)
    r = await client.chat.completions.create(model="p", messages=messages)
    text = r.choices[0].message.content
    visible = text.split("</think>")[-1].strip()
    messages += [
        {"role": "assistant", "content": visible},
        {"role": "user", "content": "Are you sure?"},
    ]
    r = await client.chat.completions.create(model="p", messages=messages)
    return r.choices[0].message.content


async def changes_system(task, client):
    """Changes the system prompt mid-episode."""
    messages = question(task)
    r = await client.chat.completions.create(model="p", messages=messages)
    messages += [
        {"role": "assistant", "content": r.choices[0].message.content},
        {"role": "user", "content": "Again, please."},
    ]
    messages[0] = {"role": "system", "content": "Answer in one word."}
    r = await client.chat.completions.create(model="p", messages=messages)
    return r.choices[0].message.content


# ---- harnesses with bugs ---------------------------------------------------------------------


async def raises(task, client):
    await client.chat.completions.create(model="p", messages=question(task))
    raise RuntimeError("the harness's own bug")


async def raises_at_once(task, client):
    raise KeyError("question")


async def never_calls(task, client):
    return "42"


async def sleeps_forever(task, client):
    await client.chat.completions.create(model="p", messages=question(task))
    while True:
        await asyncio.sleep(3600)


async def spins_forever(task, client):
    """Blocks its event loop: a synchronous busy loop inside an async agent."""
    await client.chat.completions.create(model="p", messages=question(task))
    while True:
        time.time()


async def calls_forever(task, client):
    """Asks again and again, ignoring the answers (and any error)."""
    messages = question(task)
    while True:
        r = await client.chat.completions.create(model="p", messages=messages)
        messages += [
            {"role": "assistant", "content": r.choices[0].message.content},
            {"role": "user", "content": "Go on."},
        ]


async def wants_json(task, client):
    """Reads the model's answer as JSON (a structured-output harness)."""
    r = await client.chat.completions.create(model="p", messages=question(task))
    return json.loads(r.choices[0].message.content)["sum"]


async def makes_its_own_client(task, base_url, api_key):
    """An agent that builds its own client (as LangChain's ChatOpenAI or a framework's
    settings do) from the base URL and key it is given."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url, api_key=api_key)
    return await solve(task, client)
