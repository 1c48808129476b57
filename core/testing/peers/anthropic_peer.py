"""A loopback Anthropic Messages API (plain and SSE streaming), ``wire-protocols.md`` section 7.3.

Point the SDK at ``peer.base_url`` (no ``/v1``), or ``ANTHROPIC_BASE_URL``. Either auth header
(``x-api-key`` or ``Authorization: Bearer``) and any ``anthropic-version`` are accepted.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from core.testing.peers.script import LoopbackPeer, Reply, json_response, run_stream

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def _error(reply: Reply) -> web.Response:
    status = reply.status or 500
    body = {"type": "error", "error": {"type": _ERROR_TYPES.get(status, "api_error"), "message": reply.error_message}}
    return json_response(body, status)


class AnthropicPeer(LoopbackPeer):
    provider = "anthropic"

    def __init__(self) -> None:
        super().__init__()
        self._msg = 0

    @property
    def base_url(self) -> str:
        return self.root

    def routes(self) -> list[web.RouteDef]:
        return [web.post("/v1/messages", self._messages), web.get("/v1/models", self._models)]

    async def _models(self, request: web.Request) -> web.Response:
        key = request.headers.get("x-api-key") or request.headers.get("Authorization", "").removeprefix("Bearer ")
        if self.api_key is not None and key != self.api_key:
            return _error(Reply(status=401, error_message="invalid x-api-key"))
        model = {
            "type": "model",
            "id": "claude-sonnet-4-5",
            "display_name": "Claude",
            "created_at": "2025-01-01T00:00:00Z",
        }
        return json_response({"data": [model], "has_more": False, "first_id": model["id"], "last_id": model["id"]}, 200)

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        received, reply = await self._take(request)
        if reply is None:
            return _error(Reply(status=400, error_message="the peer has no scripted reply"))
        if reply.status:
            return _error(reply)
        self._msg += 1
        content: list[dict[str, Any]] = []
        searched = any(str(tool.get("type", "")).startswith("web_search_") for tool in received.body.get("tools") or ())
        if searched and (reply.cited or reply.search_error):
            tool_id = f"srvtoolu_{self._msg}"
            content.append({"type": "server_tool_use", "id": tool_id, "name": "web_search",
                            "input": {"query": "the question"}})  # fmt: skip
            results: Any = [{"type": "web_search_result", "url": c.url, "title": c.title, "encrypted_content": "e",
                             "page_age": None} for c in reply.cited]  # fmt: skip
            if reply.search_error:
                results = {"type": "web_search_tool_result_error", "error_code": reply.search_error}
            content.append({"type": "web_search_tool_result", "tool_use_id": tool_id, "content": results})
            for c in reply.cited:
                citation = {"type": "web_search_result_location", "url": c.url, "title": c.title,
                            "cited_text": c.quote, "encrypted_index": "i"}  # fmt: skip
                content.append({"type": "text", "text": c.quote, "citations": [citation]})
        if reply.text:
            content.append({"type": "text", "text": reply.text})
        for call in reply.tool_calls:
            content.append(
                {"type": "tool_use", "id": self.call_id(call, "toolu_"), "name": call.name, "input": call.arguments}
            )
        stop = "max_tokens" if reply.finish == "length" else ("tool_use" if reply.tool_calls else "end_turn")
        usage = {
            "input_tokens": reply.input_tokens - reply.cached_tokens,
            "output_tokens": reply.output_tokens,
            "cache_read_input_tokens": reply.cached_tokens,
            "cache_creation_input_tokens": 0,
        }
        message = {
            "id": f"msg_{self._msg}",
            "type": "message",
            "role": "assistant",
            "model": received.body.get("model", "claude-x"),
            "stop_reason": stop,
            "stop_sequence": None,
            "content": content,
            "usage": usage,
        }
        if not received.body.get("stream"):
            return json_response(message)

        def ev(kind: str, **data: Any) -> tuple[str, str]:
            return kind, json.dumps({"type": kind, **data})

        def frames() -> Any:
            yield ev(
                "message_start",
                message={**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}},
            )
            yield ev("ping")
            for index, block in enumerate(content):
                if block["type"] == "text":
                    yield ev("content_block_start", index=index, content_block={"type": "text", "text": ""})
                    for word in reply.words():
                        yield ev("content_block_delta", index=index, delta={"type": "text_delta", "text": word})
                else:
                    yield ev("content_block_start", index=index, content_block={**block, "input": {}})
                    yield ev(
                        "content_block_delta",
                        index=index,
                        delta={"type": "input_json_delta", "partial_json": json.dumps(block["input"])},
                    )
                yield ev("content_block_stop", index=index)
            yield ev(
                "message_delta",
                delta={"stop_reason": stop, "stop_sequence": None},
                usage={"output_tokens": reply.output_tokens},
            )
            yield ev("message_stop")

        return await run_stream(request, reply, frames())
