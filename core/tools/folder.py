"""Tools of a folder the person lends for one ``pepper chat --folder`` session.

The CLI declares its tools (MCP's shape: ``name``, ``description``, ``inputSchema``,
``annotations``) and runs them on the person's machine; Pepper offers them to that person's web
turns while the lending lasts. :func:`check_declared` refuses a declaration with any tool whose
annotations do not say ``readOnlyHint: true``, so a CLI cannot lend a tool that writes. A call
is queued for the CLI (``core.records.folders``) and its answer awaited within a time limit; the
answer reaches the model as labelled untrusted text.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any
from uuid import UUID

from core.errors import InvalidInput
from core.records import folders
from core.tools.registry import Tool, ToolContext, ToolOutcome
from core.untrusted import folder_result_block

AREA = "files"  # documents Pepper made and the lent folder (docs/feature-areas.md)
CONNECTION = "folder"
MAX_TOOLS = 8
CALL_SECONDS = 20.0
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,30}$")


def check_declared(tools: Any) -> list[dict[str, Any]]:
    """The declared tools, normalised; ``InvalidInput`` naming the first problem."""
    if not isinstance(tools, list) or not tools:
        raise InvalidInput("declare the folder's tools as a non-empty list")
    if len(tools) > MAX_TOOLS:
        raise InvalidInput(f"at most {MAX_TOOLS} folder tools")
    out: list[dict[str, Any]] = []
    for tool in tools:
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str) or not _NAME.fullmatch(tool["name"]):
            raise InvalidInput("each tool needs a name of lower-case letters, digits and '_'")
        name = tool["name"]
        annotations = tool.get("annotations")
        if not isinstance(annotations, dict) or annotations.get("readOnlyHint") is not True:
            raise InvalidInput(f"the tool {name!r} does not say it is read-only (annotations.readOnlyHint)")
        schema = tool.get("inputSchema")
        if not isinstance(schema, dict) or schema.get("type") != "object":
            raise InvalidInput(f"the tool {name!r} needs an inputSchema of type object")
        description = tool.get("description")
        if not isinstance(description, str) or not 1 <= len(description) <= 500:
            raise InvalidInput(f"the tool {name!r} needs a description of 1 to 500 characters")
        if any(t["name"] == name for t in out):
            raise InvalidInput(f"the tool {name!r} is declared twice")
        read_only = {"readOnlyHint": True}
        out.append({"name": name, "description": description, "inputSchema": schema, "annotations": read_only})
    return out


def folder_tools(folder_id: UUID, declared: list[dict[str, Any]], *, seconds: float = CALL_SECONDS) -> list[Tool]:
    """Pepper tools for a lending's declared tools (checked again: a stored row is not trusted)."""
    tools: list[Tool] = []
    for spec in check_declared(declared):
        name = spec["name"]

        async def handler(ctx: ToolContext, args: dict[str, Any], name: str = name) -> ToolOutcome:
            call_id = await folders.add_call(ctx.db, folder_id, name, args)
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                found = await folders.result_of(ctx.db, call_id)
                if found is not None:
                    text, is_error = found
                    block = folder_result_block(name, text)
                    return ToolOutcome.failed(block) if is_error else ToolOutcome.ok(block)
                await asyncio.sleep(0.05)
            return ToolOutcome.failed(f"the person's computer did not answer {name} within {seconds:g} s")

        tools.append(
            Tool(
                name=f"folder__{name}",
                description=f"(the folder the person lent from their computer, read-only) {spec['description']}",
                parameters=spec["inputSchema"],
                handler=handler,
                area=AREA,
                needs_connection=CONNECTION,
            )
        )
    return tools
