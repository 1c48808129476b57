"""Fixtures for web research: a loopback web, the helper's own model peer, the helper process."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from web_support import Helper, helper_settings

from core.testing.peers import OpenAIPeer
from core.testing.web_peer import WebPeer
from gateway.research import ResearchHelper


@pytest.fixture
async def helper() -> AsyncIterator[Helper]:
    async with WebPeer() as web, OpenAIPeer() as model:
        process = ResearchHelper(helper_settings(web, model.base_url))
        process.start()
        try:
            await process.ready()
            yield Helper(web, model, process)
        finally:
            await process.stop(2)
