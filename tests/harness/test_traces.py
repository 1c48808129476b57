"""OpenTelemetry traces: a turn is one trace (model calls, gate decisions, tool calls and the
delivery inside it), sent over OTLP/HTTP to a loopback collector, with ids and kinds only."""

import pytest

from core import tracing
from core.testing.otlp_collector import running_collector
from core.testing.scripted import calls, reply
from core.tools import Tool
from core.tools.context import SessionContext
from core.tools.gate import Gate, Policy, Verdict
from text_loop import deliver, run_turn

PRIVATE = ("call mum", "Prefers mornings", "I prefer mornings", "Ticked off", "Ada")


@pytest.fixture
def collector(monkeypatch):
    tracing.reset()
    with running_collector() as collector:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", collector.url)
        monkeypatch.setenv("OTEL_SERVICE_NAME", "pepper-test")
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")  # milliseconds
        yield collector
        tracing.reset()


async def _turn_with_tools(db, deps, models, account):
    todo = await db.fetchval("INSERT INTO todos (account_id, title) VALUES ($1, 'call mum') RETURNING id", account.id)
    models.script(
        calls(("complete_todo", {"id": todo}), ("add_dossier_note", {"note": "Prefers mornings"})),
        reply("Ticked off, and noted."),
    )
    outcome = await run_turn(deps, account.id, "web", "done with that; I prefer mornings")
    await deliver(deps, outcome.turn_id, True)
    return outcome


async def test_a_turn_is_one_trace_of_model_gate_tool_and_delivery_spans(db, deps, models, account, collector):
    outcome = await _turn_with_tools(db, deps, models, account)
    assert tracing.flush()
    (turn,) = await collector.wait_for("pepper.turn")
    await collector.wait_for("pepper.delivery")
    assert turn.service == "pepper-test"
    assert turn.parent_id == ""
    assert turn.attributes["pepper.turn_id"] == str(outcome.turn_id)
    assert turn.attributes["pepper.account_id"] == str(account.id)
    assert turn.attributes["pepper.channel"] == "web" and turn.attributes["pepper.status"] == outcome.status

    in_trace = [span for span in collector.spans if span.trace_id == turn.trace_id]
    names = sorted(span.name for span in in_trace)
    # Two rounds of the model, two tools each through the gate, and the delivery reported after.
    assert names.count("pepper.tool") == 2 and names.count("pepper.gate") == 2
    assert len([n for n in names if n.startswith("pepper.model.")]) == 2
    assert names.count("pepper.delivery") == 1
    by_id = {span.span_id: span for span in in_trace}
    for tool in collector.named("pepper.tool"):
        assert by_id[tool.parent_id].name == "pepper.turn"
        assert tool.attributes["pepper.tool_status"] in {"ok", "staged"}
    for gate in collector.named("pepper.gate"):
        assert by_id[gate.parent_id].name == "pepper.tool"
        assert gate.attributes["pepper.gate.allowed"] is True
    (delivery,) = collector.named("pepper.delivery")
    assert delivery.parent_id == turn.span_id and delivery.attributes["pepper.writes"] == 2
    model = next(span for span in in_trace if span.name.startswith("pepper.model."))
    assert model.attributes["pepper.provider"] == "openai" and model.attributes["pepper.tokens.input"] > 0

    # Ids, kinds and counts only: none of the person's words, anywhere in what was sent.
    sent = b"".join(collector.bodies)
    for words in PRIVATE:
        assert words.encode() not in sent, words


async def test_a_denied_call_names_the_policy_that_denied_it(account, collector):
    async def nothing(ctx, args):
        raise AssertionError("a denied tool never runs")

    tool = Tool("wipe_everything", "Test tool.", {"type": "object"}, nothing, area="test")
    gate = Gate(
        [Policy("allow-all", lambda t, a, s: Verdict.allow()), Policy("never", lambda t, a, s: Verdict.deny("no"))]
    )
    session = SessionContext(kind="live", trust="owner_unverified", channel="sms", account_id=account.id)
    decision = await gate.decide(tool, {}, session)
    assert not decision.allowed
    assert tracing.flush()
    (span,) = await collector.wait_for("pepper.gate")
    assert span.attributes == {
        "pepper.tool": "wipe_everything",
        "pepper.kind": "live",
        "pepper.trust": "owner_unverified",
        "pepper.gate.allowed": False,
        "pepper.gate.policy": "never",
    }


async def test_without_an_endpoint_nothing_is_traced_or_sent(db, deps, models, account, monkeypatch):
    tracing.reset()
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    with running_collector() as collector:
        await _turn_with_tools(db, deps, models, account)
        assert not tracing.enabled()
        assert tracing.flush()
    assert collector.bodies == []
    tracing.reset()


def test_only_allowed_attribute_keys_are_kept():
    kept = tracing.attributes(
        {"pepper.tool": "add_todo", "pepper.text": "call mum", "phone": "+15550001", "pepper.rounds": 2}
    )
    assert kept == {"pepper.tool": "add_todo", "pepper.rounds": 2}
