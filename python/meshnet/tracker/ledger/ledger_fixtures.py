"""Fixtures the ledger's tests share (pytest): `db`, where a new ledger goes, once a SQLite file
and once a new schema on a real PostgreSQL server (`postgres`, one per test module; its cases
are skipped with the reason where the server cannot start). Test code only."""

from __future__ import annotations

import pytest

from meshnet.tracker.ledger.postgres_server import server_or_skip


@pytest.fixture(scope="module")
def postgres():
    server = server_or_skip()
    yield server
    server.teardown()


@pytest.fixture(params=["sqlite", "postgres"])
def db(request, tmp_path):
    """Where a new ledger goes: a SQLite file's path, or the URL of a new schema on a PostgreSQL server."""
    if request.param == "sqlite":
        return tmp_path / "ledger.db"
    return request.getfixturevalue("postgres").new_schema()
