"""``pepper backup PATH`` and ``pepper restore PATH`` (the work is in ``core.store.backup``).

The passphrase comes from ``--passphrase-file``, else ``PEPPER_BACKUP_PASSPHRASE``, else a prompt
on a terminal; never from the command line, which every user of the machine can read.
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.settings import Settings
from core.store.backup import BackupError, backup, restore
from core.store.queries import Queries

PASSPHRASE_VARIABLE = "PEPPER_BACKUP_PASSPHRASE"


def add_commands(sub: Any) -> None:
    for name, text in (
        ("backup", "write the store and secret.key to one file, encrypted with a passphrase"),
        ("restore", "restore a backup into an empty data dir (and an empty DATABASE_URL database, if set)"),
    ):
        command = sub.add_parser(name, help=text)
        command.add_argument("path", metavar="PATH", help="the backup file")
        command.add_argument("--data-dir", help="data folder (PEPPER_DATA_DIR, default ~/.pepper)")
        command.add_argument(
            "--passphrase-file", help=f"read the passphrase from this file's first line (else {PASSPHRASE_VARIABLE})"
        )


async def run(args: argparse.Namespace, settings: Settings, db: Queries, out: Callable[[str], None]) -> bool:
    return False  # backup and restore run before the store opens (gateway.cli calls ``run_command``)


def passphrase(args: argparse.Namespace, *, confirm: bool) -> str:
    if args.passphrase_file:
        try:
            text = Path(args.passphrase_file).expanduser().read_text().splitlines()
        except OSError as exc:
            raise BackupError(f"cannot read the passphrase file {args.passphrase_file}: {exc.strerror}") from exc
        value = text[0] if text else ""
    elif os.environ.get(PASSPHRASE_VARIABLE):
        value = os.environ[PASSPHRASE_VARIABLE]
    elif sys.stdin.isatty():
        value = getpass.getpass("Backup passphrase: ")
        if confirm and getpass.getpass("Repeat the passphrase: ") != value:
            raise BackupError("the two passphrases differ; nothing written")
    else:
        raise BackupError(f"no passphrase: give --passphrase-file, set {PASSPHRASE_VARIABLE}, or run on a terminal")
    if not value:
        raise BackupError("the passphrase is empty")
    return value


def backup_path(args: argparse.Namespace) -> Path:
    return Path(args.path).expanduser()


async def run_command(args: argparse.Namespace, settings: Settings, out: Callable[[str], None]) -> int:
    path = backup_path(args)
    if args.command == "backup":
        done = await backup(settings, path, passphrase(args, confirm=True))
        key = "and secret.key" if done.secret_key else "(no secret.key in the data dir)"
        out(f"backed up {done.store} (schema version {done.schema_version}) {key} to {path}")
        if settings.secret_key is not None:
            out("note: PEPPER_SECRET_KEY is set and is not in the backup; keep it with the backup")
        return 0
    done = await restore(settings, path, passphrase(args, confirm=False))
    key = "and secret.key" if done.secret_key else "(the backup had no secret.key)"
    out(f"restored the backup of {done.created_at} {key} into {settings.data_dir}"
        f" ({done.store}, schema version {done.schema_version})")  # fmt: skip
    return 0
