"""Other frameworks on shoal, each an optional extra; importing ``shoal`` imports none of them,
nor any framework. Agents: ``shoal.integrations.langgraph`` (``shoal[langgraph]``) and
``shoal.integrations.openai_agents`` (``shoal[openai-agents]``) run a framework's agents as
durable runs. Web: ``shoal.integrations.django`` (``shoal[django]``) and
``shoal.integrations.flask`` (``shoal[flask]``); FastAPI needs none (docs/fastapi.md)."""
