"""The shop's workflows, served by ``flask --app shop shoal worker`` (SHOAL_WORKER_APP names
make_worker, called in the app context). The web process never imports this module."""

from flask import current_app

import shoal


def make_worker() -> shoal.App:
    app = shoal.App(current_app.config["SHOAL_NAMESPACE"],
                    store=current_app.config["SHOAL_STORE"])

    @app.workflow
    async def fulfil(ctx: shoal.RunContext, input: dict) -> dict:
        parcel = await ctx.step("ship", lambda: f"parcel-{input['order']}")
        return {"order": input["order"], "parcel": parcel}

    return app
