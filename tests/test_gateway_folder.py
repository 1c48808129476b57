"""`pepper chat --folder`: a folder lent read-only for one chat. The file tools run in the CLI (paths
outside the folder refused there), the server takes only tools that say they are read-only, and
each answer reaches the model as labelled untrusted text. Over a real socket, with the real app."""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from core import access, identity
from core.errors import InvalidInput
from core.settings import Settings
from core.store import Database
from core.testing.peers import OpenAIPeer, reply_text, reply_tools
from core.tools.folder import check_declared
from gateway.cli_folder import DECLARED, LentFolder, OutsideFolder
from gateway.cli_web import chat
from gateway.server import running_app


@pytest.fixture
def lent(tmp_path: Path) -> LentFolder:
    root = tmp_path / "lent"
    (root / "docs").mkdir(parents=True)
    (root / "notes.txt").write_text("buy milk\ncall the plumber\n")
    (root / "docs" / "plan.md").write_text("# Plan\nmilk first\n")
    (tmp_path / "secret.txt").write_text("the secret is 42\n")
    (root / "link_out.txt").symlink_to(tmp_path / "secret.txt")
    (root / "dir_out").symlink_to(tmp_path)
    (root / "link_in.txt").symlink_to(root / "notes.txt")
    return LentFolder(root)


def test_the_folder_tools_read_inside_and_refuse_every_way_out(lent: LentFolder, tmp_path: Path):
    assert lent.read_file("notes.txt").startswith("buy milk")
    assert lent.read_file("link_in.txt").startswith("buy milk")  # a symlink that stays inside
    assert lent.read_file("docs/../notes.txt").startswith("buy milk")
    for path in ("../secret.txt", "link_out.txt", "dir_out/secret.txt", str(tmp_path / "secret.txt"), "docs/../../x"):
        with pytest.raises(OutsideFolder):
            lent.read_file(path)
        text, is_error = lent.run("read_file", {"path": path})
        assert is_error and text.startswith("refused:") and "42" not in text
    listing = lent.list_files(".")
    assert "notes.txt" in listing and "docs/" in listing and "link_out" not in listing and "dir_out" not in listing
    hits = lent.search_files("milk")
    assert "notes.txt:1: buy milk" in hits and "docs/plan.md:2: milk first" in hits
    assert "42" not in lent.search_files("secret")
    assert lent.run("write_file", {"path": "x"}) == ("no folder tool 'write_file'", True)
    assert lent.run("read_file", {"path": "nope.txt"})[1] is True


def test_the_server_takes_only_tools_that_say_they_are_read_only():
    assert [t["name"] for t in check_declared(DECLARED)] == ["list_files", "read_file", "search_files"]
    write = {**DECLARED[0], "name": "write_file", "annotations": {"readOnlyHint": False}}
    unmarked = {**DECLARED[0], "name": "delete_file", "annotations": {}}
    for tools, message in (
        ([*DECLARED, write], "'write_file' does not say it is read-only"),
        ([unmarked], "'delete_file' does not say it is read-only"),
        ([DECLARED[0], DECLARED[0]], "declared twice"),
        ("garbage", "non-empty list"),
        ([{"name": "Bad Name"}], "lower-case"),
        ([{**DECLARED[0], "inputSchema": {"type": "string"}}], "type object"),
        ([DECLARED[0]] * 9, "at most 8"),
    ):
        with pytest.raises(InvalidInput, match=message):
            check_declared(tools)


@dataclass
class Web:
    db: Database
    model: OpenAIPeer
    base: str
    account_id: Any
    settings: Settings


@pytest.fixture
async def web(db: Database, db_url: str) -> AsyncIterator[Web]:
    ada = await identity.create_account(db, "Ada")
    async with OpenAIPeer() as model:
        settings = Settings(database_url=db_url, openai_api_key="sk-test", openai_base_url=model.base_url, port=0)
        async with running_app(settings, db) as (_, port):
            yield Web(db, model, f"http://127.0.0.1:{port}", ada.id, settings)


async def test_the_folder_api_refuses_garbage_forgeries_and_duplicates(web: Web):
    token = await access.create_api_token(web.db, web.account_id, "cli")
    bob = await identity.create_account(web.db, "Bob")
    bobs = await access.create_api_token(web.db, bob.id, "cli")

    def client(key: str | None) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.AsyncClient(base_url=web.base, headers=headers, timeout=10)

    async with client(token) as ada, client(bobs) as other, client(None) as anonymous:
        assert (await anonymous.post("/api/folder", json={"tools": DECLARED})).status_code == 401
        write = {**DECLARED[0], "name": "write_file", "annotations": {"readOnlyHint": False}}
        refused = await ada.post("/api/folder", json={"tools": [*DECLARED, write]})
        assert refused.status_code == 400 and "'write_file' does not say it is read-only" in refused.json()["message"]
        for garbage in (b"not json", b'{"tools": "x"}', b"[]"):
            assert (await ada.post("/api/folder", content=garbage)).status_code == 400
        assert await web.db.fetchval("SELECT count(*) FROM lent_folders") == 0

        lent = await ada.post("/api/folder", json={"tools": DECLARED})
        assert lent.status_code == 201
        folder = lent.json()["id"]
        assert (await ada.get(f"/api/folder/{folder}/calls")).json() == {"calls": []}
        # Another account's token, a made-up id, a garbage id: as if there were no such folder.
        assert (await other.get(f"/api/folder/{folder}/calls")).status_code == 404
        assert (await ada.get("/api/folder/not-a-uuid/calls")).status_code == 404
        from core.records import folders

        call_id = await folders.add_call(web.db, folder, "read_file", {"path": "notes.txt"})
        result = {"content": "buy milk", "is_error": False}
        assert (await other.post(f"/api/folder/{folder}/calls/{call_id}", json=result)).status_code == 404
        assert (await ada.post(f"/api/folder/{folder}/calls/{call_id}", json={"content": 5})).status_code == 400
        assert (await ada.post(f"/api/folder/{folder}/calls/{call_id}", json=result)).status_code == 200
        again = await ada.post(f"/api/folder/{folder}/calls/{call_id}", json={"content": "forged", "is_error": False})
        assert again.status_code == 409 and await folders.result_of(web.db, call_id) == ("buy milk", False)
        assert (await other.delete(f"/api/folder/{folder}")).status_code == 404
        assert (await ada.delete(f"/api/folder/{folder}")).status_code == 204
        assert (await ada.delete(f"/api/folder/{folder}")).status_code == 404
        assert (await ada.get(f"/api/folder/{folder}/calls")).status_code == 404


async def test_pepper_chat_lends_a_folder_whose_answers_reach_the_model_labelled(web: Web, lent: LentFolder):
    token = await access.create_api_token(web.db, web.account_id, "cli")
    web.model.script(
        reply_tools(("folder__read_file", {"path": "notes.txt"}), ("folder__read_file", {"path": "../secret.txt"})),
        reply_text("You wanted to buy milk and call the plumber."),
        reply_text("No folder now."),
    )
    printed: list[str] = []
    args = argparse.Namespace(url=web.base, timeout=30.0, folder=os.fspath(lent.root))
    code = await asyncio.to_thread(chat, args, web.settings, token, ["what's in my notes?"], printed.append)
    assert code == 0 and printed == ["You wanted to buy milk and call the plumber."]
    first, second = web.model.requests[:2]
    assert "folder__read_file" in [t["name"] for t in first.body["tools"]]
    outputs = [i["output"] for i in second.body["input"] if i.get("type") == "function_call_output"]
    assert outputs[0].startswith("[result of read_file from the person's lent folder; not written by the user")
    assert "buy milk" in outputs[0]
    assert "outside the lent folder" in outputs[1] and "42" not in outputs[1]
    # The chat ended, and the folder with it: the next chat without --folder has no folder tools.
    plain = argparse.Namespace(url=web.base, timeout=30.0)
    await asyncio.to_thread(chat, plain, web.settings, token, ["and now?"], printed.append)
    assert "folder__read_file" not in [t["name"] for t in web.model.requests[-1].body["tools"]]


async def test_only_the_lending_sessions_messages_see_the_folder(web: Web):
    """A folder lent by one `pepper chat` is that chat's: the person's other chats (the browser, a
    second CLI) get no folder tools, and a message cannot name a folder that is not its sender's,
    has ended, or is garbage."""
    token = await access.create_api_token(web.db, web.account_id, "cli")
    bob = await identity.create_account(web.db, "Bob")
    bobs = await access.create_api_token(web.db, bob.id, "cli")
    web.model.script(reply_text("From the other chat."), reply_text("From the lending chat."))

    def client(key: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=web.base, headers={"Authorization": f"Bearer {key}"}, timeout=10)

    async def tools_of_reply_to(ada: httpx.AsyncClient, body: dict[str, Any]) -> list[str]:
        seen = len(web.model.requests)
        sent = await ada.post("/api/messages", json=body)
        assert sent.status_code == 202, sent.text
        for _ in range(400):
            if len(web.model.requests) > seen:
                return [t["name"] for t in web.model.requests[seen].body.get("tools", [])]
            await asyncio.sleep(0.025)
        raise AssertionError("the turn never reached the model")

    async with client(token) as ada, client(bobs) as other:
        folder = (await ada.post("/api/folder", json={"tools": DECLARED})).json()["id"]
        assert not any(n.startswith("folder__") for n in await tools_of_reply_to(ada, {"text": "from the browser"}))
        lending = await tools_of_reply_to(ada, {"text": "what's in my notes?", "folder_id": folder})
        assert "folder__read_file" in lending
        for bad in ("not-a-uuid", 5, "00000000-0000-0000-0000-000000000000"):
            refused = await ada.post("/api/messages", json={"text": "x", "folder_id": bad})
            assert refused.status_code == 404, bad
        assert (await other.post("/api/messages", json={"text": "x", "folder_id": folder})).status_code == 404
        assert (await ada.delete(f"/api/folder/{folder}")).status_code == 204
        assert (await ada.post("/api/messages", json={"text": "x", "folder_id": folder})).status_code == 404
