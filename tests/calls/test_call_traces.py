"""A call is one trace: the call's span, with its tool calls inside, ids and kinds only."""

from __future__ import annotations

import pytest
from phone_support import OWNER, first_tool_output, speech

from core import tracing
from core.testing.otlp_collector import running_collector
from voice.testing.realtime_peer import call_tool, speak


@pytest.fixture
def collector(monkeypatch):
    tracing.reset()
    with running_collector() as collector:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url.removesuffix("/v1/traces"))
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")  # milliseconds: the batch goes out at once
        yield collector
        tracing.reset()


async def test_a_call_is_one_trace_with_its_tool_calls_inside(phone, collector):
    phone.model.script(call_tool("add_todo", {"title": "buy oat milk"}), speak("I can't do that yet."))
    phone.model.hear("add buy oat milk to my todos")
    answer = await phone.dial_owner()
    async with phone.caller.media(answer) as call:
        assert (await first_tool_output(phone, call, speech("todo"))).startswith("Unknown tool 'add_todo'")
        await call.hang_up()
    await phone.call_row(answer.call_sid)
    (span,) = await collector.wait_for("pepper.call")
    assert span.parent_id == ""
    assert span.attributes["pepper.call_sid"] == answer.call_sid
    assert span.attributes["pepper.end_reason"] == "hangup"
    assert span.attributes["pepper.route"]
    (tool,) = [s for s in collector.spans if s.name == "pepper.tool" and s.trace_id == span.trace_id]
    # Not yet verified: add_todo is not among the call's tools, so it never reached the gate.
    assert tool.parent_id == span.span_id
    assert tool.attributes["pepper.tool"] == "add_todo" and tool.attributes["pepper.tool_status"] == "unknown"
    sent = b"".join(collector.bodies)
    for private in (b"oat milk", OWNER.encode(), OWNER.lstrip("+").encode()):
        assert private not in sent
