"""``pepper dossier`` and ``pepper memory``: the owner's half of the dossier, the nightly jobs by
hand, re-indexing with progress, and a search from the command line."""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from core import identity
from core.errors import InvalidInput
from core.memory import dossier as dossiers
from core.memory.config import MemoryConfig
from core.memory.index import EMBEDDERS, IndexProgress, index_pending, index_state, progress, set_target
from core.memory.jobs import run_nightly_summaries
from core.memory.search import MEMORY_SEARCH
from core.settings import Settings
from core.store import Database

POLL_SECONDS = 2.0


def add_commands(sub: Any) -> None:
    dossier = sub.add_parser("dossier", help="the dossier: the person's half and Pepper's").add_subparsers(
        dest="action", required=True
    )
    show = dossier.add_parser("show", help="both halves of the dossier")
    show.add_argument("account", help="account id or unique name")
    edit = dossier.add_parser("edit", help="replace the person's half (from --file, stdin, or $EDITOR)")
    edit.add_argument("account", help="account id or unique name")
    edit.add_argument("--file", help="read the new text from this file ('-' for stdin)")
    history = dossier.add_parser("history", help="revisions of both halves, newest first, with rejected rewrites")
    history.add_argument("account", help="account id or unique name")
    history.add_argument("--limit", type=int, default=20)

    memory = sub.add_parser("memory", help="summaries, the search index and the memory jobs").add_subparsers(
        dest="action", required=True
    )
    nightly = memory.add_parser("nightly", help="run the nightly summary and dossier jobs now")
    nightly.add_argument("--account", help="only this account (id or unique name)")
    nightly.add_argument("--now", help="pretend it is this ISO time (default: now)")
    nightly.add_argument(
        "--keep-offsets", action="store_true", help="only run jobs whose time has come (default: run every due period)"
    )
    reindex = memory.add_parser("reindex", help="(re)build the search index for the configured embedding model")
    reindex.add_argument("--force", action="store_true", help="rebuild even if the model did not change")
    reindex.add_argument("--status", action="store_true", help="only show the progress")
    reindex.add_argument("--background", action="store_true", help="start it and leave it to the server")
    search = memory.add_parser("search", help="search a person's past messages and documents")
    search.add_argument("account", help="account id or unique name")
    search.add_argument("query", help='words to search for by meaning; "quoted words" also match as written')
    search.add_argument("--limit", type=int, default=8)


def _read_text(args: argparse.Namespace, current: str) -> str:
    if args.file == "-" or (args.file is None and not sys.stdin.isatty()):
        return sys.stdin.read()
    if args.file is not None:
        try:
            return Path(args.file).read_text(encoding="utf-8")
        except OSError as exc:
            raise InvalidInput(f"cannot read {args.file}: {exc.strerror or exc}") from None
    editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
    with tempfile.NamedTemporaryFile("w+", suffix=".md", encoding="utf-8", delete=False) as handle:
        handle.write(current)
        path = handle.name
    try:
        if subprocess.call([*editor.split(), path]) != 0:
            raise InvalidInput("the editor failed; nothing changed")
        return Path(path).read_text(encoding="utf-8")
    finally:
        os.unlink(path)


def _progress_line(p: IndexProgress) -> str:
    return f"indexed {p.indexed}/{p.total} messages and documents ({p.percent:.0f}%) for {p.model_id}"


async def _reindex(args: argparse.Namespace, settings: Settings, db: Database, out: Callable[[str], None]) -> None:
    from core.models.embeddings import embedder_from_settings

    now = datetime.now(UTC)
    if args.status:
        state = await index_state(db)
        out(f"active model: {state.active_model or 'none yet'}; target: {state.target_model or 'none yet'}")
        out(_progress_line(await progress(db)))
        return
    embedder = embedder_from_settings(settings)
    EMBEDDERS.use(embedder)
    state = await set_target(db, embedder, now=now, force=args.force)
    out(f"index target: {state.target_model} (searches use {state.active_model or state.target_model} until done)")
    if args.background:
        out("left to the server's memory jobs; `pepper memory reindex --status` shows the progress")
        return
    last = [0.0]

    def report(p: IndexProgress) -> None:
        if time.monotonic() - last[0] >= 1.0:
            last[0] = time.monotonic()
            out(_progress_line(p))

    while True:
        result = await index_pending(db, now=now, on_progress=report)
        if result.ran:
            break
        out("another Pepper process is indexing; " + _progress_line(await progress(db)))
        await asyncio.sleep(POLL_SECONDS)
    out(_progress_line(result))
    state = await index_state(db)
    out(f"done: searches now use {state.active_model}")


async def run(args: argparse.Namespace, settings: Settings, db: Database, out: Callable[[str], None]) -> bool:
    if args.command == "dossier":
        account = await identity.get_account(db, args.account)
        if args.action == "show":
            halves = await dossiers.load_dossier(db, account.id)
            out(f"The dossier of {account.name}")
            out("Written by the person:")
            out(halves.owner_text.strip() or "(empty)")
            out("")
            out("Written by Pepper:")
            out(halves.model_half or "(empty)")
        elif args.action == "edit":
            halves = await dossiers.load_dossier(db, account.id)
            text = _read_text(args, halves.owner_text)
            changed = await dossiers.set_owner_text(db, account.id, text, source="cli")
            out("saved the person's half (a revision was kept)" if changed else "no change")
        else:
            for r in await dossiers.revisions(db, account.id, args.limit):
                state = "accepted" if r["accepted"] else f"rejected: {r['reason']}"
                out(f"#{r['id']}  {r['created_at']:%Y-%m-%d %H:%M}  {r['half']:<5}  {r['source']:<7}  {state}")
        return True
    if args.command != "memory":
        return False
    if args.action == "nightly":
        from gateway import cli

        account_id = (await identity.get_account(db, args.account)).id if args.account else None
        try:
            now = datetime.fromisoformat(args.now) if args.now else datetime.now(UTC)
        except ValueError:
            raise InvalidInput(f"not an ISO time: {args.now!r}") from None
        now = now if now.tzinfo else now.replace(tzinfo=UTC)
        models = cli.model_service_factory(settings)
        try:
            report = await run_nightly_summaries(
                db, models, now, config=MemoryConfig(), ignore_offsets=not args.keep_offsets, account_id=account_id
            )
        finally:
            close = getattr(models, "aclose", None)
            if close is not None:
                await close()
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(report.outcomes.items())) or "nothing due"
        out(f"memory jobs: {report.claimed} run for {len(report.people)} people ({outcomes})")
        return True
    if args.action == "reindex":
        await _reindex(args, settings, db, out)
        return True
    from core.models.embeddings import embedder_from_settings

    EMBEDDERS.use(embedder_from_settings(settings))
    account = await identity.get_account(db, args.account)
    hits = await MEMORY_SEARCH.search(db, account.id, args.query, limit=args.limit)
    if not hits:
        out("nothing found")
    for h in hits:
        where = h.channel if h.source == "message" else f"{h.kind}: {h.title}"
        out(f"{h.created_at:%Y-%m-%d %H:%M}  {where}  [{h.match}]  {h.snippet}")
    return True
