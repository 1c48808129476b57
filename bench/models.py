"""Adapter overhead per call against a raw SDK call to the same loopback peer.

For each provider, plain and streaming, raw SDK calls and adapter calls alternate against one
loopback peer; the figures are wall time per call (the peer's own time included in both). The
target is a median and p99 ratio (adapter / raw) of at most 1.1.

Run: ``python -m bench.models [--calls 400]``. This file imports the vendor SDKs on purpose: the
raw side of the comparison is the SDK itself.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anthropic
import openai
from google import genai
from google.genai import types as gt

from core.models.adapters.anthropic import AnthropicAdapter
from core.models.adapters.base import CallOptions, ModelAdapter
from core.models.adapters.google import GoogleAdapter
from core.models.adapters.openai_compatible import OpenAICompatibleAdapter
from core.models.adapters.openai_responses import OpenAIResponsesAdapter
from core.models.types import ChatMessage, Prompt, ToolSpec
from core.testing.peers import AnthropicPeer, GooglePeer, LoopbackPeer, OpenAIPeer, reply_text

SYSTEM = "You are Pepper, a brief and careful assistant. " * 20
QUESTION = "What is on my calendar tomorrow morning?"
ANSWER = "You have a dentist appointment at nine and a call with Sam at eleven."
TOOL = ToolSpec("calendar_lookup", "Look up events.", {"type": "object", "properties": {"day": {"type": "string"}}})
PROMPT = Prompt(SYSTEM, (ChatMessage("user", QUESTION),), tools=(TOOL,), max_output_tokens=256)
SCHEMA = TOOL.parameters


async def _drain(stream: Any) -> None:
    async for _ in stream:
        pass


def _raw_openai(client: openai.AsyncOpenAI, streaming: bool) -> Callable[[], Awaitable[Any]]:
    tools = [{"type": "function", "name": TOOL.name, "description": TOOL.description, "parameters": SCHEMA,
              "strict": False}]  # fmt: skip
    kw: dict[str, Any] = dict(model="gpt-x", instructions=SYSTEM, input=[{"role": "user", "content": QUESTION}],
                              tools=tools, max_output_tokens=256, store=False)  # fmt: skip

    async def call() -> Any:
        if streaming:
            stream = await client.responses.create(**kw, stream=True)
            async with stream:
                await _drain(stream)
        else:
            await client.responses.create(**kw)

    return call


def _raw_compat(client: openai.AsyncOpenAI, streaming: bool) -> Callable[[], Awaitable[Any]]:
    kw: dict[str, Any] = dict(
        model="local",
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}],
        tools=[{"type": "function", "function": {"name": TOOL.name, "description": TOOL.description,
                                                 "parameters": SCHEMA}}],
        max_tokens=256,
    )  # fmt: skip

    async def call() -> Any:
        if streaming:
            stream = await client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True})
            async with stream:
                await _drain(stream)
        else:
            await client.chat.completions.create(**kw)

    return call


def _raw_anthropic(client: anthropic.AsyncAnthropic, streaming: bool) -> Callable[[], Awaitable[Any]]:
    kw: dict[str, Any] = dict(
        model="claude-x",
        max_tokens=256,
        system=[{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}],
        messages=[{"role": "user", "content": [{"type": "text", "text": QUESTION}]}],
        tools=[{"name": TOOL.name, "description": TOOL.description, "input_schema": SCHEMA}],
    )

    async def call() -> Any:
        if streaming:
            stream = await client.messages.create(**kw, stream=True)
            async with stream:
                await _drain(stream)
        else:
            await client.messages.create(**kw)

    return call


def _raw_google(client: genai.Client, streaming: bool) -> Callable[[], Awaitable[Any]]:
    def config() -> gt.GenerateContentConfig:
        return gt.GenerateContentConfig(
            system_instruction=SYSTEM,
            max_output_tokens=256,
            tools=[gt.Tool(function_declarations=[gt.FunctionDeclaration(
                name=TOOL.name, description=TOOL.description, parameters_json_schema=SCHEMA)])],
            automatic_function_calling=gt.AutomaticFunctionCallingConfig(disable=True),
        )  # fmt: skip

    contents = [gt.Content(role="user", parts=[gt.Part(text=QUESTION)])]

    async def call() -> Any:
        if streaming:
            await _drain(await client.aio.models.generate_content_stream(model="gemini-x", contents=contents,
                                                                          config=config()))  # fmt: skip
        else:
            await client.aio.models.generate_content(model="gemini-x", contents=contents, config=config())

    return call


def _adapter_call(adapter: ModelAdapter, streaming: bool, model: str) -> Callable[[], Awaitable[Any]]:
    options = CallOptions(model)

    async def call() -> Any:
        if streaming:
            await _drain(adapter.stream(PROMPT, options))
        else:
            await adapter.generate(PROMPT, options)

    return call


def _google_client(base_url: str) -> genai.Client:
    http = gt.HttpOptions(base_url=base_url, api_version="v1beta", retry_options=gt.HttpRetryOptions(attempts=1))
    return genai.Client(api_key="k", http_options=http)


async def _measure(name: str, peer: LoopbackPeer, raw: Callable, adapted: Callable, calls: int) -> tuple:
    peer.script(*[reply_text(ANSWER) for _ in range(2 * (calls + calls // 10))])
    for _ in range(calls // 10):  # warm up connections and caches
        await raw()
        await adapted()
    raw_times, adapter_times = [], []
    for _ in range(calls):
        start = time.perf_counter()
        await raw()
        raw_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        await adapted()
        adapter_times.append(time.perf_counter() - start)
    return name, raw_times, adapter_times


def _p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[98]


async def main(calls: int) -> None:
    rows = []
    for streaming in (False, True):
        async with OpenAIPeer() as peer:
            client = openai.AsyncOpenAI(api_key="k", base_url=peer.base_url, max_retries=0)
            adapter = OpenAIResponsesAdapter(api_key="k", base_url=peer.base_url)
            rows.append(await _measure("openai responses", peer, _raw_openai(client, streaming),
                                       _adapter_call(adapter, streaming, "gpt-x"), calls))  # fmt: skip
            await client.close()
            await adapter.aclose()
        async with OpenAIPeer() as peer:
            client = openai.AsyncOpenAI(api_key="k", base_url=peer.base_url, max_retries=0)
            adapter = OpenAICompatibleAdapter(base_url=peer.base_url, api_key="k")
            rows.append(await _measure("openai-compatible", peer, _raw_compat(client, streaming),
                                       _adapter_call(adapter, streaming, "local"), calls))  # fmt: skip
            await client.close()
            await adapter.aclose()
        async with AnthropicPeer() as peer:
            aclient = anthropic.AsyncAnthropic(api_key="k", base_url=peer.base_url, max_retries=0)
            adapter = AnthropicAdapter(api_key="k", base_url=peer.base_url)
            rows.append(await _measure("anthropic", peer, _raw_anthropic(aclient, streaming),
                                       _adapter_call(adapter, streaming, "claude-x"), calls))  # fmt: skip
            await aclient.close()
            await adapter.aclose()
        async with GooglePeer() as peer:
            gclient = _google_client(peer.base_url)
            adapter = GoogleAdapter(api_key="k", base_url=peer.base_url)
            rows.append(await _measure("google", peer, _raw_google(gclient, streaming),
                                       _adapter_call(adapter, streaming, "gemini-x"), calls))  # fmt: skip
            await gclient.aio.aclose()
            await adapter.aclose()
        rows[-4:] = [(f"{n} {'stream' if streaming else 'plain'}", r, a) for n, r, a in rows[-4:]]

    print(f"{calls} calls each, wall ms per call against a loopback peer")
    print(f"{'provider':<28}{'raw med':>9}{'adapt med':>11}{'ratio':>7}{'raw p99':>10}{'adapt p99':>11}{'ratio':>7}")
    for name, raw, adapted in rows:
        rm, am = statistics.median(raw) * 1e3, statistics.median(adapted) * 1e3
        rp, ap = _p99(raw) * 1e3, _p99(adapted) * 1e3
        print(f"{name:<28}{rm:>9.3f}{am:>11.3f}{am / rm:>7.2f}{rp:>10.3f}{ap:>11.3f}{ap / rp:>7.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=400)
    asyncio.run(main(parser.parse_args().calls))
