"""The HTTP side of the SSD admin endpoints, added to SGLang's FastAPI app in the main process.

FastAPI resolves handler annotations from this module's globals, hence the module-level imports
(and a module of its own: only the main process imports it). The bridge to the scheduler is
`sglang_ssd.integration.admin`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sglang.srt.utils.auth import AuthLevel, auth_level

from sglang_ssd.integration.admin import AdminError, ask_reply, combine, parse_changes
from sglang_ssd.integration.settings_view import settings_view
from sglang_ssd.transport.admin_messages import (
    AdminRequest,
)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message}}, status_code=status)


def add_routes(app: FastAPI, addresses: Sequence[str]) -> None:
    """Add `/ssd/config` (GET, POST) and `/ssd/stats` (GET) to SGLang's FastAPI `app`; each
    call goes to the admin socket of every DP replica (`addresses`, replica order) at once and
    is answered by `admin.combine`."""

    async def forward(request: AdminRequest) -> JSONResponse:
        replies = await asyncio.gather(
            *(asyncio.to_thread(ask_reply, address, request) for address in addresses)
        )
        status, body = combine(request.op, list(replies))
        return JSONResponse(body, status_code=status)

    @auth_level(AuthLevel.ADMIN_OPTIONAL)
    async def get_ssd_config() -> JSONResponse:
        """Every SSD setting as given ("settings") and the value in force ("in_force")."""
        return await forward(AdminRequest(op="config"))

    @auth_level(AuthLevel.ADMIN_OPTIONAL)
    async def set_ssd_config(request: Request) -> JSONResponse:
        """Change the live settings (a JSON object of some of `config.LIVE_FIELDS`; settings
        fixed at startup may be given at their value, as GET's "settings" lists them)."""
        body = await request.body()
        now = await asyncio.to_thread(ask_reply, addresses[0], AdminRequest(op="config"))
        if now.status != 200 or now.config is None:
            return _error(now.status, now.error or "no settings from the SSD worker")
        try:
            changes = parse_changes(body, settings_view(now.config))
        except AdminError as exc:
            return _error(exc.status, str(exc))
        return await forward(AdminRequest(op="configure", changes=changes))

    @auth_level(AuthLevel.ADMIN_OPTIONAL)
    async def get_ssd_stats() -> JSONResponse:
        """Per-round timings, cache hit rate, backup rounds, speculator faults and restarts."""
        return await forward(AdminRequest(op="stats"))

    app.add_api_route("/ssd/config", get_ssd_config, methods=["GET"])
    app.add_api_route("/ssd/config", set_ssd_config, methods=["POST"])
    app.add_api_route("/ssd/stats", get_ssd_stats, methods=["GET"])
