"""A loopback OpenAI: Responses and Chat Completions (plain and SSE streaming) and embeddings.

Point the SDK at ``peer.base_url`` (``AsyncOpenAI(base_url=peer.base_url)`` or ``OPENAI_BASE_URL``).
The same peer serves an OpenAI-compatible endpoint (Ollama, vLLM, llama.cpp) for Chat Completions.
Wire shapes follow ``wire-protocols.md`` section 7.1/7.2.
"""

from __future__ import annotations

import base64
import hashlib
import json
import struct
from collections import deque
from typing import Any

from aiohttp import web

from core.models.voice_models import VOICE_MODELS
from core.testing.peers.script import LoopbackPeer, Received, Reply, json_response, run_stream

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
}


def _error(reply: Reply) -> web.Response:
    status = reply.status or 500
    body = {"error": {"message": reply.error_message, "type": _ERROR_TYPES.get(status, "server_error"), "code": None}}
    return json_response(body, status)


def fake_embedding(text: str, dims: int) -> list[float]:
    """A deterministic unit-ish vector per text, so tests can compare results."""
    out: list[float] = []
    counter = 0
    while len(out) < dims:
        digest = hashlib.blake2b(f"{counter}:{text}".encode(), digest_size=64).digest()
        out.extend((b - 127.5) / 127.5 for b in digest)
        counter += 1
    vec = out[:dims]
    norm = sum(v * v for v in vec) ** 0.5 or 1.0
    return [v / norm for v in vec]


class OpenAIPeer(LoopbackPeer):
    provider = "openai"

    def __init__(self, *, embedding_dims: int = 16) -> None:
        super().__init__()
        self.embedding_dims = embedding_dims
        # As OpenAI lists them: a text model and the current voice models (core.models.voice_models).
        self.models = ["gpt-5-mini", *(m for v in VOICE_MODELS if v.provider == "openai" for m in v.current)]
        self.embedding_faults: deque[Reply] = deque()
        self._resp = 0

    @property
    def base_url(self) -> str:
        return f"{self.root}/v1"

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/responses", self._responses),
            web.post("/v1/chat/completions", self._chat),
            web.post("/v1/embeddings", self._embeddings),
            web.get("/v1/models", self._models),
        ]

    async def _models(self, request: web.Request) -> web.Response:
        key = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if self.api_key is not None and key != self.api_key:
            return _error(Reply(status=401, error_message="Incorrect API key provided"))
        data = [{"id": name, "object": "model", "created": 0, "owned_by": "openai"} for name in self.models]
        return json_response({"object": "list", "data": data}, 200)

    # Responses API.
    def _response_object(self, received: Received, reply: Reply, status: str = "completed") -> dict[str, Any]:
        self._resp += 1
        output: list[dict[str, Any]] = []
        searched = any(tool.get("type") == "web_search" for tool in received.body.get("tools") or ())
        text, annotations = reply.text, []
        if searched and reply.cited:
            text = reply.cited_text()
            output.append(
                {
                    "type": "web_search_call",
                    "id": f"ws_{self._resp}",
                    "status": "completed",
                    "action": {
                        "type": "search",
                        "query": str(received.body.get("input", ""))[:200],
                        "sources": [{"type": "url", "url": c.url} for c in reply.cited],
                    },
                }
            )
            for c in reply.cited:
                start = text.index(c.quote)
                annotations.append(
                    {"type": "url_citation", "start_index": start, "end_index": start + len(c.quote),
                     "url": c.url, "title": c.title}
                )  # fmt: skip
        if text:
            output.append(
                {
                    "type": "message",
                    "id": f"msg_{self._resp}",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": annotations}],
                }
            )
        for n, call in enumerate(reply.tool_calls, start=1):
            output.append(
                {
                    "type": "function_call",
                    "id": f"fc_{self._resp}_{n}",
                    "call_id": self.call_id(call, "call_"),
                    "name": call.name,
                    "arguments": json.dumps(call.arguments),
                    "status": "completed",
                }
            )
        incomplete = reply.finish == "length"
        return {
            "id": f"resp_{self._resp}",
            "object": "response",
            "created_at": 0,
            "status": "incomplete" if incomplete and status == "completed" else status,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "model": received.body.get("model", "gpt-x"),
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "service_tier": received.body.get("service_tier") or "default",
            "usage": {
                "input_tokens": reply.input_tokens,
                "input_tokens_details": {"cached_tokens": reply.cached_tokens},
                "output_tokens": reply.output_tokens,
                "output_tokens_details": {"reasoning_tokens": reply.reasoning_tokens},
                "total_tokens": reply.input_tokens + reply.output_tokens,
            },
        }

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        received, reply = await self._take(request)
        if reply is None:
            return _error(Reply(status=400, error_message="the peer has no scripted reply"))
        if reply.status:
            return _error(reply)
        final = self._response_object(received, reply)
        if not received.body.get("stream"):
            return json_response(final)
        return await run_stream(request, reply, self._response_frames(final, reply))

    def _response_frames(self, final: dict[str, Any], reply: Reply) -> Any:
        seq = 0

        def frame(kind: str, **data: Any) -> tuple[str, str]:
            nonlocal seq
            seq += 1
            return kind, json.dumps({"type": kind, "sequence_number": seq, **data})

        started = {**final, "status": "in_progress", "output": [], "usage": None}
        yield frame("response.created", response=started)
        for index, item in enumerate(final["output"]):
            if item["type"] == "message":
                yield frame(
                    "response.output_item.added",
                    output_index=index,
                    item={**item, "content": [], "status": "in_progress"},
                )
                for word in reply.words():
                    yield frame(
                        "response.output_text.delta",
                        item_id=item["id"],
                        output_index=index,
                        content_index=0,
                        delta=word,
                        logprobs=[],
                    )
                yield frame(
                    "response.output_text.done",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    text=reply.text,
                    logprobs=[],
                )
            else:
                yield frame(
                    "response.output_item.added",
                    output_index=index,
                    item={**item, "arguments": "", "status": "in_progress"},
                )
                yield frame(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=index,
                    delta=item["arguments"],
                )
                yield frame(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    name=item["name"],
                    arguments=item["arguments"],
                )
            yield frame("response.output_item.done", output_index=index, item=item)
        yield frame("response.incomplete" if final["status"] == "incomplete" else "response.completed", response=final)

    # Chat Completions.
    async def _chat(self, request: web.Request) -> web.StreamResponse:
        received, reply = await self._take(request)
        if reply is None:
            return _error(Reply(status=400, error_message="the peer has no scripted reply"))
        if reply.status:
            return _error(reply)
        self._resp += 1
        model = received.body.get("model", "local")
        calls = [
            {
                "id": self.call_id(c, "call_"),
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
            }
            for c in reply.tool_calls
        ]
        finish = reply.finish or ("tool_calls" if calls else "stop")
        usage = {
            "prompt_tokens": reply.input_tokens,
            "completion_tokens": reply.output_tokens,
            "total_tokens": reply.input_tokens + reply.output_tokens,
            "prompt_tokens_details": {"cached_tokens": reply.cached_tokens},
            "completion_tokens_details": {"reasoning_tokens": reply.reasoning_tokens},
        }
        ident = f"chatcmpl-{self._resp}"
        if not received.body.get("stream"):
            message = {"role": "assistant", "content": reply.text or None}
            if calls:
                message["tool_calls"] = calls
            return json_response(
                {
                    "id": ident,
                    "object": "chat.completion",
                    "created": 0,
                    "model": model,
                    "choices": [{"index": 0, "finish_reason": finish, "message": message}],
                    "usage": usage,
                }
            )
        include_usage = bool((received.body.get("stream_options") or {}).get("include_usage"))

        def chunk(delta: dict[str, Any] | None, finish_reason: str | None = None, **extra: Any) -> tuple[None, str]:
            choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish_reason}]
            return None, json.dumps(
                {
                    "id": ident,
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": model,
                    "choices": choices,
                    **extra,
                }
            )

        def frames() -> Any:
            yield chunk({"role": "assistant", "content": ""})
            for word in reply.words():
                yield chunk({"content": word})
            for index, call in enumerate(calls):
                yield chunk(
                    {
                        "tool_calls": [
                            {
                                "index": index,
                                "id": call["id"],
                                "type": "function",
                                "function": {"name": call["function"]["name"], "arguments": ""},
                            }
                        ]
                    }
                )
                yield chunk(
                    {"tool_calls": [{"index": index, "function": {"arguments": call["function"]["arguments"]}}]}
                )
            yield chunk({}, finish)
            if include_usage:
                yield chunk(None, usage=usage)
            yield None, "[DONE]"

        return await run_stream(request, reply, frames())

    # Embeddings.
    async def _embeddings(self, request: web.Request) -> web.Response:
        received, _ = await self._record_only(request)
        if self.embedding_faults:
            return _error(self.embedding_faults.popleft())
        inputs = received.body.get("input", [])
        if isinstance(inputs, str):
            inputs = [inputs]
        dims = int(received.body.get("dimensions") or self.embedding_dims)
        as_base64 = received.body.get("encoding_format") == "base64"
        data = []
        for index, text in enumerate(inputs):
            vector = fake_embedding(str(text), dims)
            encoded: Any = base64.b64encode(struct.pack(f"<{dims}f", *vector)).decode() if as_base64 else vector
            data.append({"object": "embedding", "index": index, "embedding": encoded})
        tokens = sum(len(str(t).split()) for t in inputs)
        return json_response(
            {
                "object": "list",
                "data": data,
                "model": received.body.get("model", "emb"),
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )

    async def _record_only(self, request: web.Request) -> tuple[Received, None]:
        body = await request.json()
        received = Received(request.method, request.path, dict(request.headers), dict(request.query), body)
        self.requests.append(received)
        return received, None
