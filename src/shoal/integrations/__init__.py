"""Adapters that run other frameworks' agents inside shoal runs. Each module needs its extra:
``shoal.integrations.openai_agents`` needs ``shoal[openai-agents]``. Nothing else in shoal
imports them."""
