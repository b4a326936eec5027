"""The tracker child process for tests, with a fixed test secret (see meshnet.swarm.local)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from meshnet.swarm.local import TrackerProcess as _TrackerProcess

SECRET = "test-swarm-secret"


def TrackerProcess(workdir: Path, models: list[dict], lease_seconds: float = 10.0, db: Optional[Path] = None,
                   tls: Optional[tuple[Path, Path]] = None) -> _TrackerProcess:
    return _TrackerProcess(workdir, models, SECRET, lease_seconds=lease_seconds, db=db, tls=tls)
