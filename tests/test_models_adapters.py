"""Each adapter, through its real SDK, against its loopback peer: the same conversation, the same result."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from core.models import (
    ChatMessage,
    Generation,
    ModelAuthError,
    ModelRequestError,
    ModelTransientError,
    Prompt,
    StreamInterrupted,
    TextDelta,
    ToolCall,
    ToolResult,
    ToolSpec,
    Usage,
)
from core.models.adapters.anthropic import AnthropicAdapter
from core.models.adapters.base import CallOptions, ModelAdapter
from core.models.adapters.google import GoogleAdapter
from core.models.adapters.openai_compatible import OpenAICompatibleAdapter
from core.models.adapters.openai_responses import OpenAIResponsesAdapter
from core.testing.peers import (
    AnthropicPeer,
    GooglePeer,
    LoopbackPeer,
    OpenAIPeer,
    Reply,
    ScriptedCall,
    fault,
    reply_text,
    reply_tools,
)

TOOLS = (
    ToolSpec(
        "get_weather", "Current weather in a city.", {"type": "object", "properties": {"city": {"type": "string"}}}
    ),
    ToolSpec("get_time", "Local time in a zone.", {"type": "object", "properties": {"zone": {"type": "string"}}}),
)
SYSTEM = "You are Pepper. Be brief."
MEMORY = "The person lives in Paris."


def _openai(peer: LoopbackPeer, timeout: float) -> ModelAdapter:
    return OpenAIResponsesAdapter(api_key="test-key", base_url=peer.base_url, timeout=timeout)  # type: ignore[attr-defined]


def _compat(peer: LoopbackPeer, timeout: float) -> ModelAdapter:
    return OpenAICompatibleAdapter(base_url=peer.base_url, timeout=timeout)  # type: ignore[attr-defined]


def _anthropic(peer: LoopbackPeer, timeout: float) -> ModelAdapter:
    return AnthropicAdapter(api_key="test-key", base_url=peer.base_url, timeout=timeout)  # type: ignore[attr-defined]


def _google(peer: LoopbackPeer, timeout: float) -> ModelAdapter:
    return GoogleAdapter(api_key="test-key", base_url=peer.base_url, timeout=timeout)  # type: ignore[attr-defined]


KINDS: dict[str, tuple[type[LoopbackPeer], Callable[[LoopbackPeer, float], ModelAdapter]]] = {
    "openai": (OpenAIPeer, _openai),
    "openai-compatible": (OpenAIPeer, _compat),
    "anthropic": (AnthropicPeer, _anthropic),
    "google": (GooglePeer, _google),
}


@pytest.fixture(params=list(KINDS))
async def pair(request: pytest.FixtureRequest) -> AsyncIterator[tuple[LoopbackPeer, ModelAdapter]]:
    peer_cls, make = KINDS[request.param]
    async with peer_cls() as peer:
        adapter = make(peer, 10.0)  # generous: a loaded CI machine once took 2 s to connect on loopback
        yield peer, adapter
        await adapter.aclose()


def script_two_tool_rounds(peer: LoopbackPeer) -> None:
    peer.script(
        reply_tools(ScriptedCall("get_weather", {"city": "Paris"}, id="call_w"), text="Let me check."),
        reply_tools(ScriptedCall("get_time", {"zone": "Europe/Paris"}, id="call_t"), input_tokens=30, cached_tokens=20),
        reply_text("It is sunny in Paris, and it is noon.", input_tokens=50, output_tokens=12, cached_tokens=20),
    )


TOOL_OUTPUT = {"get_weather": "sunny, 21 C", "get_time": "12:00"}


async def run_conversation(adapter: ModelAdapter, *, streaming: bool) -> tuple[list[Any], list[str]]:
    """Two tool rounds and a final answer; returns each round's normalised result and the deltas."""
    messages: list[ChatMessage] = [ChatMessage("user", "What's the weather and time in Paris?")]
    rounds: list[Any] = []
    deltas: list[str] = []
    for _ in range(3):
        prompt = Prompt(SYSTEM, tuple(messages), system_dynamic=MEMORY, tools=TOOLS, max_output_tokens=256)
        if streaming:
            events = [e async for e in adapter.stream(prompt, CallOptions("test-model"))]
            assert all(isinstance(e, TextDelta) for e in events[:-1])
            gen = events[-1]
            assert isinstance(gen, Generation)
            deltas.append("".join(e.text for e in events[:-1] if isinstance(e, TextDelta)))
        else:
            gen = await adapter.generate(prompt, CallOptions("test-model"))
        rounds.append((gen.text, gen.tool_calls, gen.finish_reason, gen.usage, gen.model, gen.provider))
        messages.append(gen.as_message())
        for call in gen.tool_calls:
            result = ToolResult(call.id, call.name, TOOL_OUTPUT[call.name])
            messages.append(ChatMessage("tool", tool_result=result))
        if not gen.tool_calls:
            break
    return rounds, deltas


def expected(provider: str) -> list[Any]:
    return [
        ("Let me check.", (ToolCall("call_w", "get_weather", {"city": "Paris"}),), "tool_calls", Usage(10, 5, 0, 0)),
        ("", (ToolCall("call_t", "get_time", {"zone": "Europe/Paris"}),), "tool_calls", Usage(30, 5, 20, 0)),
        ("It is sunny in Paris, and it is noon.", (), "stop", Usage(50, 12, 20, 0)),
    ]


@pytest.mark.parametrize("streaming", [False, True], ids=["plain", "streaming"])
async def test_two_tool_rounds_give_the_same_normalised_result(
    pair: tuple[LoopbackPeer, ModelAdapter], streaming: bool
) -> None:
    peer, adapter = pair
    script_two_tool_rounds(peer)
    rounds, deltas = await run_conversation(adapter, streaming=streaming)
    assert [r[:4] for r in rounds] == expected(adapter.provider)
    assert {r[4] for r in rounds} == {"test-model"}
    assert {r[5] for r in rounds} == {adapter.provider}
    if streaming:
        assert deltas == ["Let me check.", "", "It is sunny in Paris, and it is noon."]
    assert len(peer.requests) == 3 and peer.unscripted == 0
    assert all(r.streaming == streaming for r in peer.requests)
    check_wire(adapter.provider, peer)


def check_wire(provider: str, peer: LoopbackPeer) -> None:
    """What the SDK sent: system, tools, and both tool results mapped the provider's way."""
    last = peer.requests[-1].body
    if provider == "openai":
        assert last["instructions"] == f"{SYSTEM}\n\n{MEMORY}"
        assert [t["name"] for t in last["tools"]] == ["get_weather", "get_time"]
        outputs = [i for i in last["input"] if i.get("type") == "function_call_output"]
        assert [(o["call_id"], o["output"]) for o in outputs] == [("call_w", "sunny, 21 C"), ("call_t", "12:00")]
        calls = [i for i in last["input"] if i.get("type") == "function_call"]
        assert [c["call_id"] for c in calls] == ["call_w", "call_t"]
        assert last["store"] is False and "service_tier" not in last
    elif provider == "openai-compatible":
        assert last["messages"][0] == {"role": "system", "content": f"{SYSTEM}\n\n{MEMORY}"}
        tools = [m for m in last["messages"] if m["role"] == "tool"]
        assert [(m["tool_call_id"], m["content"]) for m in tools] == [("call_w", "sunny, 21 C"), ("call_t", "12:00")]
        assert last["messages"][2]["tool_calls"][0]["function"]["name"] == "get_weather"
    elif provider == "anthropic":
        assert last["system"] == [
            {"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": MEMORY},
        ]
        assert [t["name"] for t in last["tools"]] == ["get_weather", "get_time"]
        roles = [m["role"] for m in last["messages"]]
        assert roles == ["user", "assistant", "user", "assistant", "user"]
        results = [b for m in last["messages"] for b in m["content"] if b["type"] == "tool_result"]
        assert [(b["tool_use_id"], b["content"]) for b in results] == [("call_w", "sunny, 21 C"), ("call_t", "12:00")]
        assert last["messages"][1]["content"][0] == {"type": "text", "text": "Let me check."}
    else:
        assert last["systemInstruction"]["parts"][0]["text"] == f"{SYSTEM}\n\n{MEMORY}"
        decls = last["tools"][0]["functionDeclarations"]
        assert [d["name"] for d in decls] == ["get_weather", "get_time"]
        responses = [p["functionResponse"] for c in last["contents"] for p in c["parts"] if "functionResponse" in p]
        assert [(r["id"], r["response"]) for r in responses] == [
            ("call_w", {"result": "sunny, 21 C"}),
            ("call_t", {"result": "12:00"}),
        ]
        assert [c["role"] for c in last["contents"]] == ["user", "model", "user", "model", "user"]


PROMPT = Prompt(SYSTEM, (ChatMessage("user", "hi"),))


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (400, ModelRequestError),
        (404, ModelRequestError),
        (422, ModelRequestError),
        (401, ModelAuthError),
        (403, ModelAuthError),
        (429, ModelTransientError),
        (500, ModelTransientError),
        (503, ModelTransientError),
    ],
)
async def test_http_errors_map_onto_the_error_tree(
    pair: tuple[LoopbackPeer, ModelAdapter], status: int, error: type[Exception]
) -> None:
    peer, adapter = pair
    peer.script(fault(status), fault(status))
    with pytest.raises(error) as plain:
        await adapter.generate(PROMPT, CallOptions("m"))
    with pytest.raises(error) as streamed:
        async for _ in adapter.stream(PROMPT, CallOptions("m")):
            pass
    for caught in (plain.value, streamed.value):
        assert caught.status == status and caught.provider == adapter.provider  # type: ignore[attr-defined]
    assert len(peer.requests) == 2  # max_retries=0: the SDK did not retry


async def test_timeout_is_transient(pair: tuple[LoopbackPeer, ModelAdapter]) -> None:
    peer, adapter = pair
    fast = KINDS[adapter.provider][1](peer, 0.1)
    peer.script(reply_text("late", delay=0.5))
    try:
        with pytest.raises(ModelTransientError):
            await fast.generate(PROMPT, CallOptions("m"))
    finally:
        await fast.aclose()


async def test_stream_cut_after_first_token_is_interrupted(pair: tuple[LoopbackPeer, ModelAdapter]) -> None:
    peer, adapter = pair
    peer.script(reply_text("one two three four five six seven eight", cut_after=5))
    seen: list[str] = []
    with pytest.raises(StreamInterrupted):
        async for event in adapter.stream(PROMPT, CallOptions("m")):
            assert isinstance(event, TextDelta)
            seen.append(event.text)
    assert seen and "".join(seen) != "one two three four five six seven eight"


async def test_stream_cut_before_any_token_is_transient(pair: tuple[LoopbackPeer, ModelAdapter]) -> None:
    peer, adapter = pair
    # Google sends text in the first frame; cut before any frame for every provider.
    peer.script(Reply(text="hello there", cut_after=0))
    with pytest.raises(ModelTransientError):
        async for _ in adapter.stream(PROMPT, CallOptions("m")):
            pass


async def test_truncated_reply_reports_length(pair: tuple[LoopbackPeer, ModelAdapter]) -> None:
    peer, adapter = pair
    peer.script(reply_text("cut sho", finish="length"))
    gen = await adapter.generate(PROMPT, CallOptions("m"))
    assert (gen.text, gen.finish_reason) == ("cut sho", "length")


async def test_anthropic_thinking_budget_effort_and_tool_cache_breakpoint() -> None:
    async with AnthropicPeer() as peer:
        adapter = AnthropicAdapter(api_key="k", base_url=peer.base_url)
        peer.script(reply_text("ok"))
        prompt = Prompt("", (ChatMessage("user", "hi"),), tools=TOOLS, max_output_tokens=500)
        await adapter.generate(prompt, CallOptions("claude-x", effort="low", thinking_budget=2000))
        await adapter.aclose()
    body = peer.requests[0].body
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 2000}
    assert body["max_tokens"] == 2500
    assert body["output_config"] == {"effort": "low"}
    assert "system" not in body
    assert body["tools"][-1]["cache_control"] == {"type": "ephemeral"}
    assert "cache_control" not in body["tools"][0]


async def test_openai_effort_and_flex_tier_on_the_wire() -> None:
    async with OpenAIPeer() as peer:
        adapter = OpenAIResponsesAdapter(api_key="k", base_url=peer.base_url)
        peer.script(reply_text("ok"))
        gen = await adapter.generate(PROMPT, CallOptions("gpt-x", effort="minimal", background=True))
        await adapter.aclose()
    body = peer.requests[0].body
    assert body["reasoning"] == {"effort": "minimal"} and body["service_tier"] == "flex"
    assert gen.extras["service_tier"] == "flex"
    assert peer.requests[0].headers["Authorization"] == "Bearer k"


async def test_google_thinking_config_flex_and_key_header() -> None:
    async with GooglePeer() as peer:
        adapter = GoogleAdapter(api_key="k", base_url=peer.base_url)
        peer.script(reply_text("ok"), reply_text("ok"))
        await adapter.generate(PROMPT, CallOptions("gemini-x", thinking_budget=512, background=True))
        await adapter.generate(PROMPT, CallOptions("gemini-x", effort="low"))
        await adapter.aclose()
    # google-genai sends some of these in snake_case and some in camelCase; accept either.
    first, second = (_camel(r.body) for r in peer.requests)
    assert first["generationConfig"]["thinkingConfig"] == {"thinkingBudget": 512}
    assert str(first.get("serviceTier", first["generationConfig"].get("serviceTier"))).lower() == "flex"
    assert second["generationConfig"]["thinkingConfig"] == {"thinkingLevel": "LOW"}
    assert "serviceTier" not in second and "serviceTier" not in second["generationConfig"]
    assert peer.requests[0].headers["x-goog-api-key"] == "k"
    assert peer.requests[0].path == "/v1beta/models/gemini-x:generateContent"


def _camel(value: Any) -> Any:
    if isinstance(value, dict):
        return {re.sub(r"_([a-z])", lambda m: m.group(1).upper(), k): _camel(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_camel(v) for v in value]
    return value


@pytest.mark.parametrize("streaming", [False, True], ids=["plain", "streaming"])
@pytest.mark.parametrize("kind", ["openai", "openai-compatible"])
async def test_openai_bodies_are_exactly_the_adapters_json(kind: str, streaming: bool) -> None:
    """The OpenAI adapters hand the SDK their JSON as ``extra_body`` (its TypedDict transform was
    most of a turn's CPU): the body on the wire must be that JSON, the model and stream flag
    included, with nothing of the SDK's own placeholders left in it."""
    from core.models.adapters import openai_compatible, openai_responses

    module = openai_responses if kind == "openai" else openai_compatible
    prompt = Prompt(SYSTEM, (ChatMessage("user", "hi"),), system_dynamic=MEMORY, tools=TOOLS, temperature=0.2)
    options = CallOptions("gpt-x", effort="low")
    async with OpenAIPeer() as peer:
        adapter = KINDS[kind][1](peer, 10.0)
        peer.script(reply_text("ok"))
        if streaming:
            [*_] = [event async for event in adapter.stream(prompt, options)]
        else:
            await adapter.generate(prompt, options)
        await adapter.aclose()
    expected = module._params(prompt, options)
    if streaming:
        expected["stream"] = True
        if kind == "openai-compatible":
            expected["stream_options"] = {"include_usage": True}
    assert peer.requests[0].body == expected


def test_the_openai_adapter_does_the_sdks_first_use_work_when_it_is_built(subprocess_env):
    """The SDK imports its Responses resource on first access and builds its response models on the
    first reply: over a second of CPU that, left lazy, lands on the event loop inside the first turn
    after start-up (on a loaded machine that turn then outlasts the channels' waits). Building the
    adapter (at start-up) does it instead. A fresh interpreter, so no other test did it first."""
    probe = (
        "import sys\n"
        "from core.models.adapters.openai_responses import OpenAIResponsesAdapter\n"
        "lazy = 'openai.resources.responses.responses'\n"
        "assert lazy not in sys.modules, 'imported before the adapter was built'\n"
        "OpenAIResponsesAdapter(api_key='sk-test', base_url='http://127.0.0.1:9/v1')\n"
        "from openai.types.responses import Response\n"
        "print(lazy in sys.modules, Response.__pydantic_complete__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], env=subprocess_env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True"]
