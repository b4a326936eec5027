"""The tracker child process for tests (see meshnet.swarm.local): TLS, role tokens, ticket key."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from meshnet.swarm.local import TrackerProcess as _TrackerProcess


def TrackerProcess(workdir: Path, models: list[dict], lease_seconds: float = 10.0,
                   db: Optional[Path] = None, extra_args: Sequence[str] = ()) -> _TrackerProcess:
    """`extra_args`: more tracker flags."""
    return _TrackerProcess(workdir, models, lease_seconds=lease_seconds, db=db, extra_args=extra_args)
