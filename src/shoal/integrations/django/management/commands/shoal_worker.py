"""``manage.py shoal_worker [MODULE:APP]``: serve the project's shoal App until SIGTERM or
Ctrl-C."""

from __future__ import annotations

import logging
import sys
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from shoal.app.collector import tune_from_env
from shoal.integrations._commands import one_line, serve
from shoal.integrations._loading import load_app
from shoal.integrations.django import settings


class Command(BaseCommand):  # type: ignore[misc]
    help = ("Serve the shoal App named by settings.SHOAL['APP'] (or MODULE:APP): execute its "
            "runs until SIGTERM or Ctrl-C, then stop gracefully.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("app", nargs="?", metavar="MODULE:APP",
                            help="The App to serve (default: settings.SHOAL['APP']).")
        parser.add_argument("--concurrency", type=int, default=None,
                            help="Runs executed at once (the App's max_concurrent_runs).")
        parser.add_argument("--shutdown-timeout", type=float, default=25.0,
                            help="Seconds a stop waits for running runs (default 25).")
        parser.add_argument("--no-migrate", action="store_true",
                            help="Never change the store's schema (run shoal_migrate first).")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            self._serve(options)
        except ImproperlyConfigured as e:
            raise CommandError(str(e)) from None
        except Exception as e:   # shoal's own, as `shoal worker` prints it: one line
            line = one_line(e)
            if line is None:
                raise
            raise CommandError(line) from None

    def _serve(self, options: dict[str, Any]) -> None:
        spec = options["app"] or settings().app
        if spec is None:
            raise CommandError("Name the App to serve: settings.SHOAL['APP'] = "
                               "'orders.workflows:app', or manage.py shoal_worker MODULE:APP.")
        app = load_app(spec, "settings.SHOAL['APP']" if not options["app"] else "MODULE:APP")
        if options["concurrency"] is not None:
            if options["concurrency"] < 1:
                raise CommandError("--concurrency must be 1 or more.")
            app.max_concurrent_runs = options["concurrency"]
        if options["no_migrate"]:
            app.migrate = False
        if not logging.getLogger().handlers:
            logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                                format="%(asctime)s %(levelname)-7s %(name)s: %(message)s")
        try:   # a process of its own: as `shoal worker` does (shoal.app.collector)
            tuned = tune_from_env()
        except ValueError as e:
            raise CommandError(str(e)) from None

        def announce() -> None:
            self.stderr.write(f"shoal_worker: serving {app!r}, max_concurrent_runs="
                              f"{app.max_concurrent_runs}, gc={'tuned' if tuned else 'default'}; "
                              f"SIGTERM or Ctrl-C stops it gracefully.")

        serve(app, options["shutdown_timeout"], announce)
