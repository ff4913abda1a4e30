"""Agent frameworks on shoal: each module runs one framework's agents as durable shoal runs and
needs that framework installed, as an optional extra (``shoal[langgraph]`` for
``shoal.integrations.langgraph``, ``shoal[openai-agents]`` for
``shoal.integrations.openai_agents``). Nothing else in shoal imports them."""
