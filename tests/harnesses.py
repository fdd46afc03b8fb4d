"""Agents written with other protocols' SDKs and with agent frameworks, as their docs write
them: no tracerl import. The gateway tests train and break them (`tracerl.gateway`); the
adding task and its tool are `tests/agents.py`'s."""

from __future__ import annotations

import json

from anthropic import AsyncAnthropic

from tests.agents import SYSTEM, TOOLS, add

# ---- Anthropic Messages: the anthropic SDK's tool loop ---------------------------------------

ANTHROPIC_TOOLS = [
    {
        "name": t["function"]["name"],
        "description": t["function"]["description"],
        "input_schema": t["function"]["parameters"],
    }
    for t in TOOLS
]


async def anthropic_loop(task, client: AsyncAnthropic):
    """Anthropic's documented tool loop: while the model stops for tool use, run the tools
    and send their results back as tool_result blocks."""
    messages = [{"role": "user", "content": f"What is {task['a']} + {task['b']}?"}]
    for _ in range(10):
        response = await client.messages.create(
            model="policy", max_tokens=1024, system=SYSTEM, tools=ANTHROPIC_TOOLS,
            messages=messages,
        )  # fmt: skip
        if response.stop_reason != "tool_use":
            return "".join(b.text for b in response.content if b.type == "text")
        messages.append({"role": "assistant", "content": response.content})
        results = [
            {"type": "tool_result", "tool_use_id": b.id, "content": add(**b.input)}
            for b in response.content
            if b.type == "tool_use"
        ]
        messages.append({"role": "user", "content": results})
    return None


async def anthropic_streaming(task, client: AsyncAnthropic):
    """The same loop, streamed (the SDK assembles the message from the events)."""
    messages = [{"role": "user", "content": f"What is {task['a']} + {task['b']}?"}]
    for _ in range(10):
        async with client.messages.stream(
            model="policy", max_tokens=1024, system=SYSTEM, tools=ANTHROPIC_TOOLS,
            messages=messages,
        ) as stream:  # fmt: skip
            response = await stream.get_final_message()
        if response.stop_reason != "tool_use":
            return "".join(b.text for b in response.content if b.type == "text")
        messages.append({"role": "assistant", "content": response.content})
        results = [
            {"type": "tool_result", "tool_use_id": b.id, "content": add(**b.input)}
            for b in response.content
            if b.type == "tool_use"
        ]
        messages.append({"role": "user", "content": results})
    return None


async def anthropic_edits_result(task, client: AsyncAnthropic):
    """Sends a tool result, then sends it again rewritten (a summarizing harness)."""
    messages = [{"role": "user", "content": f"What is {task['a']} + {task['b']}?"}]
    kw = {"model": "p", "max_tokens": 64, "system": SYSTEM, "tools": ANTHROPIC_TOOLS}
    response = await client.messages.create(messages=messages, **kw)
    messages.append({"role": "assistant", "content": response.content})
    calls = [b for b in response.content if b.type == "tool_use"]
    result = [{"type": "tool_result", "tool_use_id": calls[0].id, "content": add(**calls[0].input)}]
    await client.messages.create(messages=[*messages, {"role": "user", "content": result}], **kw)
    result[0]["content"] = "the sum is " + result[0]["content"]
    response = await client.messages.create(
        messages=[*messages, {"role": "user", "content": result}], **kw
    )
    return "".join(b.text for b in response.content if b.type == "text")


async def anthropic_sends_an_image(task, client: AsyncAnthropic):
    """A content block the gateway cannot render."""
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}
    content = [{"type": "text", "text": "What is in it?"}, image]
    await client.messages.create(
        model="p", max_tokens=8, messages=[{"role": "user", "content": content}]
    )


# ---- OpenAI Responses: the openai SDK's responses loop --------------------------------------

RESPONSES_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]


async def responses_chained(task, client):
    """The Responses API's documented loop: the server keeps the conversation; each request
    sends only the tool outputs and the previous response's id."""
    response = await client.responses.create(
        model="policy", instructions=SYSTEM, tools=RESPONSES_TOOLS,
        input=f"What is {task['a']} + {task['b']}?",
    )  # fmt: skip
    for _ in range(10):
        calls = [item for item in response.output if item.type == "function_call"]
        if not calls:
            return response.output_text
        outputs = [
            {"type": "function_call_output", "call_id": c.call_id,
             "output": add(**json.loads(c.arguments))}
            for c in calls
        ]  # fmt: skip
        response = await client.responses.create(
            model="policy", instructions=SYSTEM, tools=RESPONSES_TOOLS,
            previous_response_id=response.id, input=outputs,
        )  # fmt: skip
    return None


async def responses_stateless(task, client):
    """The same loop keeping its own state (``store=False``): the whole input each time, the
    model's output items echoed back."""
    items = [{"role": "user", "content": f"What is {task['a']} + {task['b']}?"}]
    for _ in range(10):
        response = await client.responses.create(
            model="policy", instructions=SYSTEM, tools=RESPONSES_TOOLS, input=items,
            store=False,
        )  # fmt: skip
        calls = [item for item in response.output if item.type == "function_call"]
        if not calls:
            return response.output_text
        items += [item.model_dump(exclude_none=True) for item in response.output]
        items += [
            {"type": "function_call_output", "call_id": c.call_id,
             "output": add(**json.loads(c.arguments))}
            for c in calls
        ]  # fmt: skip
    return None


async def responses_streaming(task, client):
    """One streamed request: the answer's text, assembled from its events."""
    stream = await client.responses.create(
        model="policy", instructions=SYSTEM, input=f"What is {task['a']} + {task['b']}?",
        stream=True,
    )  # fmt: skip
    parts = []
    async for event in stream:
        if event.type == "response.output_text.delta":
            parts.append(event.delta)
    return "".join(parts)


async def responses_goes_back(task, client):
    """Chains from an older response than the latest (a harness that retries a branch)."""
    kw = {"model": "p", "instructions": SYSTEM, "tools": RESPONSES_TOOLS}
    first = await client.responses.create(input=f"What is {task['a']} + {task['b']}?", **kw)
    calls = [item for item in first.output if item.type == "function_call"]
    outputs = [
        {"type": "function_call_output", "call_id": c.call_id,
         "output": add(**json.loads(c.arguments))}
        for c in calls
    ]  # fmt: skip
    await client.responses.create(previous_response_id=first.id, input=outputs, **kw)
    again = await client.responses.create(
        previous_response_id=first.id, input=[*outputs, {"role": "user", "content": "Sure?"}], **kw
    )
    return again.output_text


async def responses_changes_instructions(task, client):
    """Chains from the latest response with new instructions (a changed system prompt)."""
    kw = {"model": "p", "tools": RESPONSES_TOOLS}
    first = await client.responses.create(
        instructions=SYSTEM, input=f"What is {task['a']} + {task['b']}?", **kw
    )
    calls = [item for item in first.output if item.type == "function_call"]
    outputs = [
        {"type": "function_call_output", "call_id": c.call_id,
         "output": add(**json.loads(c.arguments))}
        for c in calls
    ]  # fmt: skip
    r = await client.responses.create(
        instructions="Answer tersely.", previous_response_id=first.id, input=outputs, **kw
    )
    return r.output_text


async def responses_sends_reasoning(task, client):
    """An item the gateway cannot reproduce (another model's reasoning)."""
    items = [
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "hm"}]},
        {"role": "user", "content": "What is 2 + 3?"},
    ]
    await client.responses.create(model="p", input=items)


async def responses_unknown_id(task, client):
    """Chains from a response this session never gave."""
    await client.responses.create(model="p", previous_response_id="resp_nope", input="Hi")


# ---- sub-agents: a planner and two parallel workers, one episode -----------------------------


async def planner_and_workers(task, base_url, api_key):
    """A planner asks for a plan, two workers (fresh contexts, each its own session: the
    episode's key with ``/worker1``, ``/worker2``) run at once, and the planner answers from
    their reports. The sub-sessions' contract is docs/gateway.md's."""
    import asyncio

    from openai import AsyncOpenAI

    def client(name=None):
        key = api_key if name is None else f"{api_key}/{name}"
        return AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0)

    async def ask(c, messages, tools=None):
        kw = {"tools": tools} if tools else {}
        r = await c.chat.completions.create(model="p", messages=messages, **kw)
        return r.choices[0].message

    async def worker(name, part):
        c = client(name)
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": part}]
        message = await ask(c, messages, TOOLS)
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or ():
            result = add(**json.loads(call.function.arguments))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        return (await ask(c, messages, TOOLS)).content

    planner = client()
    plan = [{"role": "user", "content": f"Plan: what is {task['a']} + {task['b']}?"}]
    first = await ask(planner, plan)
    reports = await asyncio.gather(
        worker("worker1", f"What is {task['a']} + {task['b']}?"),
        worker("worker2", f"What is {task['b']} + {task['a']}?"),
    )
    plan += [
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": "Reports: " + "; ".join(r or "" for r in reports)},
    ]
    return (await ask(planner, plan)).content


# ---- a harness that compacts its own history -------------------------------------------------


async def compacts(task, client):
    """Solves with the tool, then replaces the turns so far with a summary (a harness
    managing its context) and asks on."""
    from tests.agents import question

    messages = question(task)
    message = (
        (await client.chat.completions.create(model="p", messages=messages, tools=TOOLS))
        .choices[0]
        .message
    )
    messages.append(message.model_dump(exclude_none=True))
    for call in message.tool_calls or ():
        args = json.loads(call.function.arguments)
        messages.append({"role": "tool", "tool_call_id": call.id, "content": add(**args)})
    answer = await client.chat.completions.create(model="p", messages=messages, tools=TOOLS)
    messages.append(answer.choices[0].message.model_dump(exclude_none=True))
    summary = {"role": "user", "content": "Summary so far: add(2, 3) returned 5."}
    compacted = [*messages[:2], summary, {"role": "user", "content": "Say it in words."}]
    r = await client.chat.completions.create(model="p", messages=compacted, tools=TOOLS)
    return r.choices[0].message.content


# ---- more rewrites, one per case and protocol ------------------------------------------------


async def _anthropic_round(task, client):
    """Ask, run the model's tool calls: the messages so far (with the results)."""
    messages = [{"role": "user", "content": f"What is {task['a']} + {task['b']}?"}]
    kw = {"model": "p", "max_tokens": 64, "system": SYSTEM, "tools": ANTHROPIC_TOOLS}
    response = await client.messages.create(messages=messages, **kw)
    messages.append({"role": "assistant", "content": response.content})
    results = [
        {"type": "tool_result", "tool_use_id": b.id, "content": add(**b.input)}
        for b in response.content
        if b.type == "tool_use"
    ]
    messages.append({"role": "user", "content": results})
    return messages, kw


async def anthropic_drops_message(task, client: AsyncAnthropic):
    """Memory trimming: drops the question and the model's call, keeps the result's turn
    as a plain user message."""
    messages, kw = await _anthropic_round(task, client)
    trimmed = [{"role": "user", "content": "The tool said 5. What is the answer?"}]
    await client.messages.create(messages=messages, **kw)
    r = await client.messages.create(messages=[messages[0], *trimmed], **kw)
    return "".join(b.text for b in r.content if b.type == "text")


async def anthropic_changes_system(task, client: AsyncAnthropic):
    messages, kw = await _anthropic_round(task, client)
    r = await client.messages.create(messages=messages, **{**kw, "system": "Be terse."})
    return "".join(b.text for b in r.content if b.type == "text")


async def _responses_round(task, client):
    """The stateless loop's first round: the items so far (with the outputs)."""
    items = [{"role": "user", "content": f"What is {task['a']} + {task['b']}?"}]
    kw = {"model": "p", "instructions": SYSTEM, "tools": RESPONSES_TOOLS, "store": False}
    response = await client.responses.create(input=items, **kw)
    items += [item.model_dump(exclude_none=True) for item in response.output]
    items += [
        {"type": "function_call_output", "call_id": c.call_id,
         "output": add(**json.loads(c.arguments))}
        for c in response.output if c.type == "function_call"
    ]  # fmt: skip
    return items, kw


async def responses_drops_item(task, client):
    """Drops the tool round (the model's function_call item and its output) and asks on:
    a trimming harness. (Dropping the call alone leaves an output answering no call, which
    cannot be rendered: refused.)"""
    items, kw = await _responses_round(task, client)
    kept = [i for i in items if i.get("type") not in ("function_call", "function_call_output")]
    kept.append({"role": "user", "content": "The tool said 5. So?"})
    r = await client.responses.create(input=kept, **kw)
    return r.output_text


async def responses_edits_output(task, client):
    """Sends the tool output, then sends it again rewritten."""
    items, kw = await _responses_round(task, client)
    await client.responses.create(input=items, **kw)
    items[-1] = {**items[-1], "output": "the sum is " + items[-1]["output"]}
    r = await client.responses.create(input=items, **kw)
    return r.output_text
