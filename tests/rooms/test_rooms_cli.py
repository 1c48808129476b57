"""``pepper rooms`` against a real Synapse: linking a Matrix ID by a code sent in a direct message,
creating rooms, inviting members and setting a member's calendar sharing level."""

from __future__ import annotations

import asyncio
import re

from gateway.cli import main


async def _pepper(capsys, *argv: str) -> tuple[int, str, str]:
    lines: list[str] = []
    code = await asyncio.to_thread(main, list(argv), out=lines.append)
    return code, "\n".join(lines), capsys.readouterr().err


async def _code_sent_to(client, within: float = 10.0) -> str:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        batch = await client.sync(None, timeout_ms=0)
        for room_id in (i.room_id for i in batch.invites):
            await client.join(room_id)
            for event in await client.history(room_id):
                found = re.search(r"\b(\d{6})\b", event.body)
                if found:
                    return found[1]
        assert loop.time() < deadline, "no code arrived"
        await asyncio.sleep(0.1)


async def test_a_person_links_their_matrix_id_and_is_put_in_a_room_with_their_calendar_shared(
    db_url, homeserver, pepper, monkeypatch, capsys, tmp_path
):
    for name, value in (("DATABASE_URL", db_url), ("PEPPER_DATA_DIR", str(tmp_path)),
                        ("PEPPER_MATRIX_HOMESERVER", homeserver.url), ("PEPPER_MATRIX_USER", pepper.user_id),
                        ("PEPPER_MATRIX_ACCESS_TOKEN", pepper.access_token)):  # fmt: skip
        monkeypatch.setenv(name, value)
    ada, bob = await homeserver.user("ada"), await homeserver.user("bob")
    for name in ("Ada", "Bob", "Cy"):
        assert (await _pepper(capsys, "account", "create", name))[0] == 0

    code, out, err = await _pepper(capsys, "rooms", "link", "Ada", "not-a-matrix-id")
    assert code == 1 and "a Matrix ID looks like @name:example.org" in err
    code, out, err = await _pepper(capsys, "rooms", "link", "Ada", ada.user_id)
    assert code == 0 and "sent a code" in out, err
    sent = await _code_sent_to(ada)
    wrong = "000000" if sent != "000000" else "111111"
    code, _, err = await _pepper(capsys, "rooms", "verify", "Ada", ada.user_id, wrong)
    assert code == 1 and "not the one Pepper sent" in err
    code, _, err = await _pepper(capsys, "rooms", "verify", "Cy", ada.user_id, sent)  # someone else's code
    assert code == 1 and "no link is pending" in err
    code, out, err = await _pepper(capsys, "rooms", "verify", "Ada", ada.user_id, sent)
    assert code == 0 and f"linked {ada.user_id} to Ada" in out, err
    code, out, _ = await _pepper(capsys, "rooms", "link", "Ada", ada.user_id)  # again: nothing to send
    assert code == 0 and "already linked" in out

    code, _, err = await _pepper(capsys, "rooms", "create", "Family", "--member", "Ada", "--member", "Bob")
    assert code == 1 and "Bob has no verified Matrix ID" in err
    assert (await _pepper(capsys, "handle", "add", "Bob", "matrix", bob.user_id, "--verified"))[0] == 0
    code, out, err = await _pepper(capsys, "rooms", "create", "Family", "--member", "Ada", "--member", "Bob")
    assert code == 0 and "created room Family" in out, err
    code, out, _ = await _pepper(capsys, "rooms", "list")
    assert "Family" in out and "members: Ada, Bob" in out
    invited = (await bob.sync(None, timeout_ms=0)).invites
    assert len(invited) == 1

    code, out, err = await _pepper(capsys, "rooms", "share", "Family", "Ada", "Pepper", "free_busy")
    assert code == 0 and "Ada shares calendar 'Pepper' with Family: free_busy" in out, err
    code, out, _ = await _pepper(capsys, "rooms", "shares", "Family", "Ada")
    assert "Pepper: free_busy" in out
    code, _, err = await _pepper(capsys, "rooms", "share", "Family", "Cy", "Pepper", "everything")
    assert code == 1 and "Cy is not a member of Family" in err
    code, out, _ = await _pepper(capsys, "rooms", "invite", "Family", "Bob")
    assert "Bob is already a member" in out
    code, _, err = await _pepper(capsys, "rooms", "skill", "Family", "Ada", "no-such-skill")
    assert code == 1 and "only one of their own" in err
