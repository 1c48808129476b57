"""How ``pepper serve`` wires rooms in: which children it starts, and Pepper's one Matrix session."""

from __future__ import annotations

import json

import pytest
import yaml

from core.errors import ConfigError
from core.settings import Settings
from gateway.rooms.homeserver import EmbeddedHomeserver, pepper_client
from gateway.rooms.process import RoomProcesses
from gateway.server import connections_needed, room_children


def test_serve_runs_synapse_unless_another_homeserver_is_named_and_nothing_with_rooms_off(tmp_path):
    embedded = room_children(Settings(data_dir=tmp_path, matrix_port=18448), "postgresql:///x")
    assert [type(c) for c in embedded] == [EmbeddedHomeserver, RoomProcesses]
    config = yaml.safe_load((tmp_path / "matrix" / "synapse" / "homeserver.yaml").read_text())
    assert config["listeners"][0]["bind_addresses"] == ["127.0.0.1"] and config["listeners"][0]["port"] == 18448
    assert config["database"]["name"] == "sqlite3" and config["enable_registration"] is False
    assert config["federation_domain_whitelist"] == []
    external = Settings(data_dir=tmp_path, matrix_homeserver="https://matrix.example.org")
    assert [type(c) for c in room_children(external, "postgresql:///x")] == [RoomProcesses]
    off = Settings(data_dir=tmp_path, rooms_enabled=False)
    assert room_children(off, "postgresql:///x") == []
    assert connections_needed(off) < connections_needed(Settings())


async def test_pepper_keeps_one_session_so_every_process_posts_as_the_same_device(homeserver, tmp_path):
    settings = Settings(data_dir=tmp_path, matrix_homeserver=homeserver.url, matrix_user=homeserver.pepper_id,
                        matrix_password=homeserver.pepper_password)  # fmt: skip
    first = await pepper_client(settings)
    again = await pepper_client(settings)
    try:
        stored = json.loads((tmp_path / "matrix" / "session.json").read_text())
        assert stored["device_id"] == first.device_id == again.device_id and again.access_token == first.access_token
        assert (tmp_path / "matrix" / "session.json").stat().st_mode & 0o077 == 0
        room = await first.create_room("one device", [])
        assert await first.send_text(room, "hi", "same-txn") == await again.send_text(room, "hi", "same-txn")
    finally:
        await first.close()
        await again.close()
    with pytest.raises(ConfigError):
        await pepper_client(Settings(data_dir=tmp_path / "other", matrix_homeserver=homeserver.url,
                                     matrix_user=homeserver.pepper_id))  # fmt: skip


async def test_processes_asking_at_once_at_a_first_start_log_in_once(homeserver, tmp_path):
    import asyncio

    settings = Settings(data_dir=tmp_path, matrix_homeserver=homeserver.url, matrix_user=homeserver.pepper_id,
                        matrix_password=homeserver.pepper_password)  # fmt: skip
    clients = await asyncio.gather(*(pepper_client(settings) for _ in range(3)))
    try:
        assert len({c.device_id for c in clients}) == 1 and len({c.access_token for c in clients}) == 1
        stored = json.loads((tmp_path / "matrix" / "session.json").read_text())
        assert stored["device_id"] == clients[0].device_id
        assert not (tmp_path / "matrix" / "session.partial").exists()
    finally:
        for client in clients:
            await client.close()


def test_doctor_says_where_the_rooms_homeserver_is_and_what_its_login_lacks(tmp_path):
    from gateway.doctor import Report, _rooms

    def said(**values):
        report = Report()
        _rooms(report, Settings(data_dir=tmp_path, **values))
        return report.checks[0].status, report.checks[0].detail

    assert said(matrix_port=18448)[1].startswith("embedded Synapse on 127.0.0.1:18448")
    assert said(rooms_enabled=False) == ("ok", "rooms are off (PEPPER_ROOMS_ENABLED=false)")
    status, detail = said(matrix_homeserver="https://m.example.org", matrix_user="pepper")
    assert status == "missing" and "full Matrix ID" in detail
    status, detail = said(matrix_homeserver="https://m.example.org", matrix_user="@pepper:m.example.org")
    assert status == "missing" and "PEPPER_MATRIX_PASSWORD" in detail
    assert (
        said(matrix_homeserver="https://m.example.org", matrix_user="@p:m.example.org", matrix_password="x")[0] == "ok"
    )
