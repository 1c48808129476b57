"""Turn records: the JSON shapes of messages, generations and prompts, and back again for replay."""

from __future__ import annotations

from typing import Any

from core.models.types import ChatMessage, Generation, ToolCall, ToolResult, ToolSpec


def call_record(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "name": call.name, "arguments": call.arguments}


def message_record(message: ChatMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message.role}
    if message.content:
        out["content"] = message.content
    if message.tool_calls:
        out["tool_calls"] = [call_record(c) for c in message.tool_calls]
    if message.tool_result is not None:
        r = message.tool_result
        out["tool_result"] = {"call_id": r.call_id, "name": r.name, "content": r.content, "is_error": r.is_error}
    return out


def message_from_record(data: dict[str, Any]) -> ChatMessage:
    result = data.get("tool_result")
    return ChatMessage(
        data["role"],
        data.get("content", ""),
        tuple(ToolCall(c["id"], c["name"], c["arguments"]) for c in data.get("tool_calls", ())),
        ToolResult(result["call_id"], result["name"], result["content"], result.get("is_error", False))
        if result
        else None,
    )


def generation_record(generation: Generation) -> dict[str, Any]:
    u = generation.usage
    return {
        "text": generation.text,
        "tool_calls": [call_record(c) for c in generation.tool_calls],
        "model": generation.model,
        "provider": generation.provider,
        "finish_reason": generation.finish_reason,
        "raw_id": generation.raw_id,
        "failed_over_from": generation.failed_over_from,
        "usage": [u.input_tokens, u.output_tokens, u.cached_input_tokens, u.reasoning_tokens],
    }


def tool_spec_record(spec: ToolSpec) -> dict[str, Any]:
    return {"name": spec.name, "description": spec.description, "parameters": spec.parameters}


def tool_spec_from_record(data: dict[str, Any]) -> ToolSpec:
    return ToolSpec(data["name"], data["description"], data["parameters"])
