"""HTTP routes served beside the Gradio UI on the same server: health, the engine line the Chat
tab shows, and the WebSocket API."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from chat import api
from chat.auth import Login
from chat.engine import EngineState
from chat.reply_log import GRACE_S
from chat.service import ChatService


def routes(
    service: ChatService, login: Login | None = None, grace_s: float = GRACE_S
) -> list[BaseRoute]:
    """/healthz (open, for load balancers: states and counts only), /status and the /chat WebSocket API."""
    async def healthz(request: Request) -> JSONResponse:
        """200 when every loaded engine is ready; 503 with the reason while one starts or failed."""
        engines = []
        healthy = True
        for engine in service.registry:
            healthy = healthy and engine.state in (EngineState.READY, EngineState.SLEEPING)
            engines.append(
                {
                    "preset": engine.preset.name,
                    "state": engine.state.value,
                    "status": engine.status(),
                    "running": engine.load.running,
                    "waiting": engine.load.waiting,
                    "kv_cache_usage": engine.load.kv_cache_usage,
                    "unfinished": engine.num_unfinished(),
                    "streams": engine.streams,
                    "start_seconds": engine.start_seconds,
                }
            )
        if not engines:
            healthy = False
        body = {"status": "ok" if healthy else "unavailable", "engines": engines}
        if not healthy:
            body["reason"] = "; ".join(str(e["status"]) for e in engines) or "No engine is loaded yet."
        return JSONResponse(body, status_code=200 if healthy else 503)

    async def status(request: Request) -> JSONResponse:
        """The Chat tab's engine line for `?preset=NAME`, which the page asks for every few seconds
        (chat/ui/engine_line.js): a plain request, where a Gradio event would cost the page a
        redraw of every component and the server a trip through its queue."""
        if login is not None and not login.allows(request):
            return JSONResponse({"error": "Log in first."}, status_code=401)
        line = service.engine_line(request.query_params.get("preset") or None)
        return JSONResponse({"line": line}, headers={"Cache-Control": "no-store"})

    return [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/status", status, methods=["GET"]),
        *api.routes(service, allows=login.allows if login else None, grace_s=grace_s),
    ]
