"""A loopback Gemini API: ``generateContent`` and ``streamGenerateContent?alt=sse`` (section 7.4).

Point google-genai at ``peer.base_url`` with ``HttpOptions(base_url=..., api_version="v1beta")``,
or ``GOOGLE_GEMINI_BASE_URL``. Both ``v1`` and ``v1beta`` paths are served.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from core.models.voice_models import VOICE_MODELS
from core.testing.peers.script import LoopbackPeer, Reply, json_response, run_stream

_STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def _error(reply: Reply) -> web.Response:
    status = reply.status or 500
    body = {"error": {"code": status, "message": reply.error_message, "status": _STATUS_NAMES.get(status, "UNKNOWN")}}
    return json_response(body, status)


class GooglePeer(LoopbackPeer):
    provider = "google"

    @property
    def base_url(self) -> str:
        return self.root

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/{version}/models/{model_action}", self._generate),
            web.get("/{version}/models", self._models),
        ]

    async def _models(self, request: web.Request) -> web.Response:
        key = request.headers.get("x-goog-api-key") or request.query.get("key")
        if self.api_key is not None and key != self.api_key:
            return _error(Reply(status=400, error_message="API key not valid. Please pass a valid API key."))
        models = self.models or [
            "gemini-2.5-flash",
            *(m for v in VOICE_MODELS if v.provider == "google" for m in v.current),
        ]
        return json_response({"models": [{"name": f"models/{name}", "displayName": "Gemini"} for name in models]}, 200)

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        model, _, action = request.match_info["model_action"].partition(":")
        if action not in ("generateContent", "streamGenerateContent"):
            return json_response({"error": {"code": 404, "message": "unknown action", "status": "NOT_FOUND"}}, 404)
        received, reply = await self._take(request)
        if reply is None:
            return _error(Reply(status=400, error_message="the peer has no scripted reply"))
        if reply.status:
            return _error(reply)
        finish = "MAX_TOKENS" if reply.finish == "length" else "STOP"
        usage = {
            "promptTokenCount": reply.input_tokens,
            "candidatesTokenCount": reply.output_tokens - reply.reasoning_tokens,
            "cachedContentTokenCount": reply.cached_tokens,
            "thoughtsTokenCount": reply.reasoning_tokens,
            "totalTokenCount": reply.input_tokens + reply.output_tokens,
        }
        calls = [
            {"functionCall": {"id": self.call_id(c, "fc_"), "name": c.name, "args": c.arguments}}
            for c in reply.tool_calls
        ]

        def response(parts: list[dict[str, Any]], last: bool) -> dict[str, Any]:
            candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
            out: dict[str, Any] = {"candidates": [candidate], "modelVersion": model, "responseId": "r1"}
            if last:
                candidate["finishReason"] = finish
                out["usageMetadata"] = usage
            return out

        if action == "generateContent":
            searched = any(
                "googleSearch" in tool or "google_search" in tool for tool in received.body.get("tools") or ()
            )
            if searched and reply.cited:
                text = reply.cited_text()
                found = response([{"text": text}], True)
                found["candidates"][0]["groundingMetadata"] = {
                    "webSearchQueries": ["the question"],
                    "groundingChunks": [{"web": {"uri": c.url, "title": c.title}} for c in reply.cited],
                    "groundingSupports": [
                        {"segment": {"startIndex": text.index(c.quote), "endIndex": text.index(c.quote) + len(c.quote),
                                     "text": c.quote}, "groundingChunkIndices": [n]}
                        for n, c in enumerate(reply.cited)
                    ],
                }  # fmt: skip
                return json_response(found)
            parts = ([{"text": reply.text}] if reply.text else []) + calls
            return json_response(response(parts, True))

        def frames() -> Any:
            words = reply.words()
            for n, word in enumerate(words):
                yield None, json.dumps(response([{"text": word}], last=not calls and n == len(words) - 1))
            if calls:
                yield None, json.dumps(response(calls, last=True))
            elif not words:
                yield None, json.dumps(response([], last=True))

        return await run_stream(request, reply, frames())
