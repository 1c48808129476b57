"""The ``sandbox`` slot: run a program with a time limit and an environment without secrets.

Whoever occupies the slot, the environment it is handed has already been stripped of every
secret Pepper holds (:func:`strip_secrets`): any variable whose value contains one of the
settings' secrets, any variable named like a credential (``*KEY*``, ``*TOKEN*``, ``*SECRET*``,
``*PASSWORD*``, ``DATABASE_URL``...), and anything not in the caller's environment to begin with.
The built-in runs the program directly (no shell) and kills it at the time limit; the slot's own
ceiling (:data:`SANDBOX_CEILING`) is only a backstop for an occupant.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from uuid import UUID

from core.slots import SANDBOX, SLOTS, SlotSpec
from core.store.queries import Queries

SANDBOX_CEILING = 300.0
MAX_OUTPUT = 64 * 1024
_CREDENTIAL_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|DATABASE_URL|^PG", re.IGNORECASE)


@dataclass(frozen=True)
class SandboxResult:
    output: str  # stdout and stderr together, cut at MAX_OUTPUT
    exit_status: int  # -1: killed at the time limit
    timed_out: bool = False


class Sandbox(Protocol):
    async def run(
        self, program: str, argv: Sequence[str], *, env: Mapping[str, str], time_limit: float
    ) -> SandboxResult: ...


def strip_secrets(env: Mapping[str, str], secrets: Collection[str]) -> dict[str, str]:
    """``env`` without any variable that names or holds a secret."""
    return {
        name: value
        for name, value in env.items()
        if not _CREDENTIAL_NAME.search(name) and not any(secret in value for secret in secrets if secret)
    }


class BuiltinSandbox:
    async def run(
        self, program: str, argv: Sequence[str], *, env: Mapping[str, str], time_limit: float
    ) -> SandboxResult:
        try:
            proc = await asyncio.create_subprocess_exec(
                program, *argv, env=dict(env), stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        except OSError as exc:  # not found, not executable: the shell's statuses
            return SandboxResult(
                f"{program}: {exc.strerror or type(exc).__name__}", 127 if isinstance(exc, FileNotFoundError) else 126
            )
        try:
            async with asyncio.timeout(time_limit):
                out, _ = await proc.communicate()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            out = b""
            if proc.stdout is not None:
                with contextlib.suppress(Exception):
                    out = await asyncio.wait_for(proc.stdout.read(MAX_OUTPUT), 1)
            await proc.wait()
            return SandboxResult(out[:MAX_OUTPUT].decode(errors="replace"), -1, timed_out=True)
        return SandboxResult(out[:MAX_OUTPUT].decode(errors="replace"), proc.returncode or 0)


def _valid(_method: str, result: Any) -> bool:
    return isinstance(result, SandboxResult) and isinstance(result.output, str) and isinstance(result.exit_status, int)


SPEC = SLOTS.register(
    SlotSpec(SANDBOX, ("run",), BuiltinSandbox(), _valid, SANDBOX_CEILING,
             "runs a program with a time limit and no secrets in its environment")
)  # fmt: skip


async def run_sandboxed(
    db: Queries, account_id: UUID | None, program: str, argv: Sequence[str], *,
    env: Mapping[str, str], secrets: Collection[str], time_limit: float,
) -> SandboxResult:  # fmt: skip
    """Run ``program`` by the occupant of the ``sandbox`` slot; ``env`` is stripped first."""
    clean = strip_secrets(env, secrets)
    result: SandboxResult = await SLOTS.call(
        db, SANDBOX, account_id, "run", program, list(argv), env=clean, time_limit=min(time_limit, SANDBOX_CEILING)
    )
    return result
