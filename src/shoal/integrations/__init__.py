"""Integrations with other frameworks, each an optional extra: ``shoal.integrations.django``
(``shoal[django]``) and ``shoal.integrations.flask`` (``shoal[flask]``); FastAPI needs none
(docs/fastapi.md). Importing ``shoal`` imports none of them, nor any framework."""
