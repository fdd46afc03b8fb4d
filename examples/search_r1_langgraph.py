"""A Search-R1 agent written with LangGraph: it knows nothing of tracerl.

The model thinks, writes ``<search>a few keywords</search>`` to look something up, reads the
results the graph appends inside ``<information></information>``, and finishes with
``<answer>...</answer>``. Retrieval is a Search-R1 retrieval server (``POST /retrieve``, the
protocol of Search-R1's own retriever) at ``$RETRIEVER_URL``.

In production it talks to whatever serves its model:

    answer = await solve({"question": "..."}, "https://api.example.com/v1", api_key)

`tracerl train examples/search_r1_langgraph.yaml` trains it (that file says how to start the
retriever): tracerl calls `solve` with its gateway's base URL and records, token by token,
what the model sampled.
"""

import asyncio
import json
import os
import re
import urllib.request

from langchain_core.messages import HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, MessagesState, StateGraph

INSTRUCTIONS = (
    "Answer the question. Think first. To look something up, write <search>a few "
    "keywords</search> and the results come back inside <information></information>. "
    "Search as often as you need; when you know the answer, write it inside "
    "<answer></answer>, as short as possible."
)
SEARCH = re.compile(r"<search>(.*?)</search>", re.DOTALL)
ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
TOP_K, SNIPPET_CHARS = 2, 200


def retrieve(query: str) -> str:
    """The top documents for `query` from the retrieval server, as the model reads them."""
    url = os.environ.get("RETRIEVER_URL", "http://127.0.0.1:8002").rstrip("/") + "/retrieve"
    body = json.dumps({"queries": [query], "topk": TOP_K}).encode()
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        hits = json.loads(response.read())["result"][0]
    lines = []
    for rank, doc in enumerate(hits, start=1):
        title, _, text = doc["contents"].partition("\n")
        cut = "..." if len(text) > SNIPPET_CHARS else ""
        lines.append(f"Doc {rank} (title {title}): {text[:SNIPPET_CHARS]}{cut}")
    return "\n".join(lines)


async def solve(task: dict, base_url: str, api_key: str) -> str | None:
    model = ChatOpenAI(model="searcher", base_url=base_url, api_key=api_key, max_retries=0)

    async def think(state: MessagesState) -> dict:
        return {"messages": [await model.ainvoke(state["messages"])]}

    async def search(state: MessagesState) -> dict:
        query = SEARCH.search(state["messages"][-1].content).group(1).strip()
        results = await asyncio.to_thread(retrieve, query)
        return {"messages": [HumanMessage(f"<information>{results}</information>")]}

    def route(state: MessagesState) -> str:
        text = state["messages"][-1].content
        return "search" if SEARCH.search(text) and not ANSWER.search(text) else END

    graph = StateGraph(MessagesState)
    graph.add_node("think", think)
    graph.add_node("search", search)
    graph.add_edge(START, "think")
    graph.add_conditional_edges("think", route)
    graph.add_edge("search", "think")
    app = graph.compile()
    question = [SystemMessage(INSTRUCTIONS), HumanMessage(task["question"])]
    state = await app.ainvoke({"messages": question}, {"recursion_limit": 12})
    found = ANSWER.search(state["messages"][-1].content)
    return found.group(1).strip() if found else None
