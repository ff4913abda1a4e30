"""Agent frameworks on shoal: each module runs one framework's agents as durable shoal runs, and
needs that framework installed (an optional extra: ``pip install 'shoal[langgraph]'``)."""
