"""The deployment files docs/going-live.md ships, checked with the programs they configure.

``docs/deploy/Caddyfile`` is validated by Caddy, then run by Caddy (on plain HTTP on loopback, as
the tunnel set-up in docs/going-live.md runs it) in front of two stand-ins for Pepper's listeners:
the media path, WebSocket upgrade included, must reach the media port and every other path the web
server. ``scripts/test`` installs Debian's ``caddy``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
from pathlib import Path

import httpx
import pytest
import websockets

ROOT = Path(__file__).resolve().parents[1]
CADDYFILE = ROOT / "docs" / "deploy" / "Caddyfile"
caddy = shutil.which("caddy")
pytestmark = pytest.mark.skipif(caddy is None, reason="caddy is not installed (scripts/test installs it)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _caddy_env(tmp_path: Path) -> dict[str, str]:
    # Caddy keeps state under $HOME / XDG dirs: keep it in the test's folder.
    return {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path / "data"),
            "XDG_CONFIG_HOME": str(tmp_path / "config")}  # fmt: skip


def test_the_shipped_caddyfile_is_valid(tmp_path):
    run = subprocess.run(
        [caddy, "validate", "--adapter", "caddyfile", "--config", str(CADDYFILE)],
        capture_output=True, text=True, timeout=60, env=_caddy_env(tmp_path),
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr


async def test_caddy_routes_the_media_socket_to_the_media_port_and_the_rest_to_the_web_server(tmp_path):
    web_port, media_port, proxy_port = _free_port(), _free_port(), _free_port()

    async def web(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await reader.readuntil(b"\r\n\r\n")
        path = request.split(b" ", 2)[1]
        body = b"web " + path
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    async def media(ws: websockets.ServerConnection) -> None:
        async for message in ws:
            await ws.send(f"media {ws.request.path} {message}")

    config = CADDYFILE.read_text()
    assert "pepper.example.org" in config and "127.0.0.1:8080" in config and "127.0.0.1:8081" in config
    config = (
        config.replace("pepper.example.org", f"http://127.0.0.1:{proxy_port}")
        .replace("127.0.0.1:8080", f"127.0.0.1:{web_port}")
        .replace("127.0.0.1:8081", f"127.0.0.1:{media_port}")
    )
    local = tmp_path / "Caddyfile"
    local.write_text("{\n\tadmin off\n}\n\n" + config)
    web_server = await asyncio.start_server(web, "127.0.0.1", web_port)
    async with websockets.serve(media, "127.0.0.1", media_port):
        proxy = await asyncio.create_subprocess_exec(
            caddy, "run", "--adapter", "caddyfile", "--config", str(local), env=_caddy_env(tmp_path),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{proxy_port}") as client:
                for _ in range(200):  # until Caddy listens
                    try:
                        answer = await client.get("/healthz")
                        break
                    except httpx.TransportError:
                        await asyncio.sleep(0.05)
                else:
                    pytest.fail("caddy did not start")
                assert answer.text == "web /healthz"
                assert (await client.post("/twilio/voice", content=b"x")).text == "web /twilio/voice"
                assert (await client.get("/api/events")).text == "web /api/events"
            async with websockets.connect(f"ws://127.0.0.1:{proxy_port}/twilio/media?t=1") as ws:
                await ws.send("hello")
                assert await asyncio.wait_for(ws.recv(), 10) == "media /twilio/media?t=1 hello"
        finally:
            proxy.terminate()
            await proxy.wait()
            web_server.close()
            await web_server.wait_closed()
