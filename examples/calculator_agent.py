"""A calculator agent written with the openai SDK alone: it knows nothing of tracerl.

In production it talks to whatever serves its model:

    client = AsyncOpenAI(base_url="https://api.example.com/v1", api_key=...)
    print(await solve({"a": 3, "b": 4}, client))

`tracerl train examples/calculator_agent.yaml` trains it: tracerl calls `solve` with a client
whose base_url is tracerl's gateway, and records, token by token, what the model sampled.
"""

import json

from openai import AsyncOpenAI

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]


def add(a: int, b: int) -> str:
    return str(a + b)


async def solve(task: dict, client: AsyncOpenAI) -> str | None:
    """Ask the model; run the tools it calls; return its final answer."""
    messages = [
        {"role": "system", "content": "Answer with the sum's last digit. You may call add."},
        {"role": "user", "content": f"{task['a']}+{task['b']}="},
    ]
    for _ in range(4):
        response = await client.chat.completions.create(
            model="calculator", messages=messages, tools=TOOLS
        )
        message = response.choices[0].message
        if not message.tool_calls:
            return message.content
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            result = add(**json.loads(call.function.arguments))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return None
