"""Turn records: the JSON shapes of messages, generations and prompts, and back again for replay."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from core.conversation import JSONText, PromptPart, PromptRecord
from core.models.types import ChatMessage, Generation, ToolCall, ToolResult, ToolSpec

# Tool schemas encoded once: (name, description, id of the schema) -> (the schema, its record as JSON).
_SPEC_JSON: dict[tuple[str, str, int], tuple[dict[str, Any], str]] = {}
_SPEC_JSON_LIMIT = 1024


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


def tool_spec_json(spec: ToolSpec) -> str:
    """``tool_spec_record(spec)`` as JSON, encoded once per schema: every turn record holds the
    schemas of all the tools its prompt offered, the same ones turn after turn.

    Keyed by the schema object itself (a tool's schema is declared once and never changed in
    place; the entry holds it, so its id cannot be reused): a tool connected, added or changed
    since is a different key and is encoded afresh.
    """
    key = (spec.name, spec.description, id(spec.parameters))
    hit = _SPEC_JSON.get(key)
    if hit is not None and hit[0] is spec.parameters:
        return hit[1]
    text = json.dumps(tool_spec_record(spec), default=str)
    if len(_SPEC_JSON) >= _SPEC_JSON_LIMIT:  # schemas built per turn (none today) cannot pile up
        _SPEC_JSON.clear()
    _SPEC_JSON[key] = (spec.parameters, text)
    return text


def prompt_record(
    *, system_stable: str, system_dynamic: str, tools: Sequence[ToolSpec], messages: Sequence[ChatMessage]
) -> PromptRecord:
    """The turn record's ``prompt`` part, encoded: the byte-stable system prefix and the tool
    schemas as parts stored once (``prompt_parts``), the memory block and the messages inline.
    Put back together (``turn_prompt`` in SQL) it is the same JSON as a dict of the four parts."""
    return PromptRecord(
        prefix=PromptPart.of(json.dumps(system_stable)),
        tools=PromptPart.of(f"[{', '.join(tool_spec_json(s) for s in tools)}]"),
        rest=JSONText(
            f'{{"system_dynamic": {json.dumps(system_dynamic)}, '
            f'"messages": {json.dumps([message_record(m) for m in messages], default=str)}}}'
        ),
    )


def prompt_record_from_json(
    prompt: dict[str, Any], *, prefix_hash: bytes | None = None, tools_hash: bytes | None = None
) -> PromptRecord:
    """``prompt_record`` of a prompt read back from a turn record (a replay records the prompt
    it started from). Read back through jsonb its JSON is no longer byte-identical (jsonb reorders
    keys), so a part read from ``prompt_parts`` keeps the hash it is stored under; only a part of an
    older row (its prompt inline) is hashed afresh."""

    def part(value: Any, stored: bytes | None) -> PromptPart:
        body = json.dumps(value)
        return PromptPart(stored, body) if stored is not None else PromptPart.of(body)

    return PromptRecord(
        prefix=part(prompt["system_stable"], prefix_hash),
        tools=part(prompt["tools"], tools_hash),
        rest=JSONText(json.dumps({"system_dynamic": prompt["system_dynamic"], "messages": prompt["messages"]})),
    )


def tool_spec_from_record(data: dict[str, Any]) -> ToolSpec:
    return ToolSpec(data["name"], data["description"], data["parameters"])
