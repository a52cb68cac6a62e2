"""The HTTP side of the SSD admin endpoints, added to SGLang's FastAPI app in the main process.

FastAPI resolves handler annotations from this module's globals, hence the module-level imports
(and a module of its own: only the main process imports it). The bridge to the scheduler is
`sglang_ssd.integration.admin`.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sglang.srt.utils.auth import AuthLevel, auth_level

from sglang_ssd.integration.admin import AdminError, ask, validate_changes


def add_routes(app: FastAPI, address: str) -> None:
    """Add `/ssd/config` (GET, POST) and `/ssd/stats` (GET) to SGLang's FastAPI `app`."""

    async def forward(op: str, **payload: Any) -> JSONResponse:
        try:
            reply = await asyncio.to_thread(ask, address, op, **payload)
        except AdminError as exc:
            return JSONResponse({"error": {"message": str(exc)}}, status_code=exc.status)
        if reply.get("status") == 200:
            return JSONResponse(reply["body"])
        return JSONResponse(
            {"error": {"message": reply.get("error", "unknown error")}},
            status_code=int(reply.get("status", 500)),
        )

    @auth_level(AuthLevel.ADMIN_OPTIONAL)
    async def get_ssd_config() -> JSONResponse:
        """Current SSD settings: β, fan-out budget and shape, backup, mode, tree depth, γ."""
        return await forward("config")

    @auth_level(AuthLevel.ADMIN_OPTIONAL)
    async def set_ssd_config(request: Request) -> JSONResponse:
        """Change β / fanout_budget / fanout / backup live (JSON object of the changes)."""
        try:
            changes = validate_changes(json.loads(await request.body()))
        except json.JSONDecodeError as exc:
            return JSONResponse({"error": {"message": f"malformed JSON: {exc}"}}, 400)
        except AdminError as exc:
            return JSONResponse({"error": {"message": str(exc)}}, exc.status)
        return await forward("configure", changes=changes)

    @auth_level(AuthLevel.ADMIN_OPTIONAL)
    async def get_ssd_stats() -> JSONResponse:
        """Per-round timings, cache hit rate, backup rounds, speculator faults and restarts."""
        return await forward("stats")

    app.add_api_route("/ssd/config", get_ssd_config, methods=["GET"])
    app.add_api_route("/ssd/config", set_ssd_config, methods=["POST"])
    app.add_api_route("/ssd/stats", get_ssd_stats, methods=["GET"])
