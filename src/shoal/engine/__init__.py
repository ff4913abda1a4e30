"""The engine: claim, execute and settle runs, with replay of checkpointed steps (``runner``),
what a workflow sees (``context``) and cron schedules (``cron``)."""
