"""A support agent written as a LangGraph graph, run durably by shoal.

The graph: ``triage`` asks a model what the customer wants; a refund goes to ``approve`` (an
``interrupt``: a shoal pause that a person answers with ``shoal approve`` or the console), then
``reply`` writes the answer. Every model call goes through a shoal provider: shared limits, a
budget per run and per tenant, and one ledger row per call.

Run it as a service, with as many replicas as you like on one store::

    export SHOAL_STORE=sqlite:///agent.db SHOAL_NAMESPACE=support
    shoal worker agent:app                 # in this folder; start it twice for two replicas
    shoal dispatch support '"My parcel arrived broken, I want a refund"' --tenant acme
    shoal pauses                           # the refund waits for a person
    shoal approve PAUSE_ID --by ana        # the run goes on, on whichever replica is free
    shoal runs; shoal ledger

Kill a replica with ``kill -9`` while it runs the graph: another one continues the run from the
last node the graph completed.

Or run ``python agent.py``: a demo in one process, on ``agent.db`` in the current folder.

``ScriptedModel`` stands in for a chat model, so the example runs without a network or a key.
Replace it with a real one, e.g. ``langchain_openai.ChatOpenAI(model="gpt-4o-mini")``, and tell
``metered`` how that client reports a 429 (``retry_after``).
"""

from __future__ import annotations

import asyncio
import os
from typing import Annotated, Any, TypedDict

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import interrupt

import shoal
from shoal.integrations.langgraph import metered, run_graph


class ScriptedModel(BaseChatModel):
    """A chat model that answers from a script: the same reply for the same question."""

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: Any = None, **kwargs: Any) -> ChatResult:
        asked = str(messages[-1].content).lower()
        if asked.startswith("triage:"):
            text = "refund" if "refund" in asked else "question"
        elif "approved" in asked:
            text = "Your refund is on its way; sorry about the parcel."
        elif "denied" in asked:
            text = "We cannot refund this order; a colleague will call you."
        else:
            text = "Thanks for writing to us: here is how it works."
        usage = {"input_tokens": 50, "output_tokens": 30, "total_tokens": 80}
        return ChatResult(generations=[ChatGeneration(
            message=AIMessage(text, usage_metadata=usage))])  # type: ignore[arg-type]


class Ticket(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    intent: str
    refund: dict[str, Any]


app = shoal.App("support", store=os.environ.get("SHOAL_STORE", "sqlite:///agent.db"))
model_provider = app.provider("model", max_concurrent=4, requests_per_minute=300,
                              price_per_token=0.000002)
app.budget(per_run=0.05, per_tenant_day=5.00)
llm = metered(ScriptedModel(), model_provider, tokens=200)


async def triage(ticket: Ticket) -> Ticket:
    question = ticket["messages"][-1].content
    intent = await llm.ainvoke(f"triage: {question}")
    return {"intent": str(intent.content)}


def approve(ticket: Ticket) -> Ticket:
    decision = interrupt({"customer_says": ticket["messages"][0].content, "amount": 40})
    return {"refund": {"approved": decision["approved"], "by": decision["by"]}}


async def reply(ticket: Ticket) -> Ticket:
    refund = ticket.get("refund")
    if refund is None:
        prompt = f"answer: {ticket['messages'][0].content}"
    else:
        prompt = f"refund {'approved' if refund['approved'] else 'denied'}"
    return {"messages": [await llm.ainvoke(prompt)]}


builder = StateGraph(Ticket)
builder.add_node("triage", triage)
builder.add_node("approve", approve)
builder.add_node("reply", reply)
builder.add_edge(START, "triage")
builder.add_conditional_edges(
    "triage", lambda t: "approve" if t["intent"] == "refund" else "reply")
builder.add_edge("approve", "reply")
builder.add_edge("reply", END)
graph = builder.compile()


@app.workflow(max_attempts=5)
async def support(ctx: shoal.RunContext, message: str) -> dict[str, Any]:
    ticket = await run_graph(ctx, graph, {"messages": [("user", message)]},
                             expires_in=3 * 86400)
    return {"intent": ticket["intent"], "refund": ticket.get("refund"),
            "answer": ticket["messages"][-1].content}


async def demo() -> None:
    async with app:
        run = await app.dispatch(support, "My parcel arrived broken, I want a refund",
                                 tenant="acme")
        while not (pauses := await app.pending_pauses()):
            await asyncio.sleep(0.05)
        print(f"run {run.id} waits for {pauses[0].name!r}: {pauses[0].request}")
        await app.resume(pauses[0].id, approved=True, by="ana")
        out = await app.result(run.id, timeout=30)
        print(out)
        assert out["refund"] == {"approved": True, "by": "ana"}
        spent = sum(row.amount for row in await app.ledger(run_id=run.id))
        print(f"{len(await app.ledger(run_id=run.id))} model calls, {spent:.6f} usd")


if __name__ == "__main__":
    asyncio.run(demo())
