"""API keys: who may use the gateway, and how many generations each may run at once.

The keys file is JSON, a list of {"name": "alice", "sha256": "<hex of the key>",
"max_concurrent": 4} (or "key": "<the key itself>" instead of "sha256", for local use; the file
should then be private). Requests carry `Authorization: Bearer <key>`. The presented key is
hashed and compared with every entry in constant time, so timing tells nothing about which
prefix matched. A key's name is what the ledger attributes its work to (route client id
"key:<name>"); names are short and plain so they are safe as labels and in logs.

Invariants: at most `max_concurrent` generations per key hold a slot; a slot is taken before a
route is asked for and given back when the generation ends however it ends. Thread-safe.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import hmac
import json
import re
import secrets
import threading
from pathlib import Path
from typing import Iterator, Optional

from meshnet.gateway.errors import ApiError

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
MAX_CONCURRENT_LIMIT = 1024


@dataclasses.dataclass(frozen=True)
class ApiKey:
    name: str
    digest: bytes  # sha256 of the key
    max_concurrent: int

    @property
    def client_id(self) -> str:
        """The route client id the tracker's ledger attributes this key's work to."""
        return f"key:{self.name}"


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def new_key() -> str:
    return "sk-meshnet-" + secrets.token_urlsafe(24)


class KeyRing:
    def __init__(self, keys: list[ApiKey]) -> None:
        names = [k.name for k in keys]
        if len(set(names)) != len(names):
            raise ValueError("API key names must be distinct")
        if len({k.digest for k in keys}) != len(keys):
            raise ValueError("two API key entries have the same key")
        self._keys = list(keys)
        self._lock = threading.Lock()
        self._in_use: dict[str, int] = {k.name: 0 for k in keys}

    @classmethod
    def load(cls, path: Path) -> "KeyRing":
        try:
            entries = json.loads(Path(path).read_text())
        except (OSError, ValueError) as err:
            raise ValueError(f"cannot read API keys from {path}: {err}") from None
        if not isinstance(entries, list) or not entries:
            raise ValueError(f"{path} must hold a non-empty JSON list of keys")
        return cls([_entry(e, i) for i, e in enumerate(entries)])

    def authenticate(self, authorization: Optional[str]) -> ApiKey:
        """The key an `Authorization` header names; 401 when it is missing or unknown."""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(401, "Missing API key: send 'Authorization: Bearer <key>'.", code="invalid_api_key")
        presented = digest(token.strip())
        found = None
        for key in self._keys:  # every entry compared, in constant time
            if hmac.compare_digest(presented, key.digest):
                found = key
        if found is None:
            raise ApiError(401, "Incorrect API key provided.", code="invalid_api_key")
        return found

    @contextlib.contextmanager
    def slot(self, key: ApiKey) -> Iterator[None]:
        """Holds one of the key's concurrent generations; 429 when all are taken."""
        with self._lock:
            if self._in_use[key.name] >= key.max_concurrent:
                raise ApiError(429, f"API key {key.name!r} already runs {key.max_concurrent} generations "
                                    "(its concurrency limit); retry when one ends.", code="concurrency_limit")
            self._in_use[key.name] += 1
        try:
            yield
        finally:
            with self._lock:
                self._in_use[key.name] -= 1

    def in_use(self, name: str) -> int:
        with self._lock:
            return self._in_use[name]


def _entry(entry: object, index: int) -> ApiKey:
    if not isinstance(entry, dict):
        raise ValueError(f"key entry {index} is not an object")
    name = entry.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"key entry {index}: name must match {_NAME.pattern}")
    limit = entry.get("max_concurrent", 4)
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_CONCURRENT_LIMIT:
        raise ValueError(f"key {name!r}: max_concurrent must be an integer in 1..{MAX_CONCURRENT_LIMIT}")
    if ("key" in entry) == ("sha256" in entry):
        raise ValueError(f"key {name!r}: give exactly one of 'key' and 'sha256'")
    if "key" in entry:
        if not isinstance(entry["key"], str) or len(entry["key"]) < 16:
            raise ValueError(f"key {name!r}: a key must be a string of at least 16 characters")
        return ApiKey(name, digest(entry["key"]), limit)
    try:
        raw = bytes.fromhex(entry["sha256"])
    except (TypeError, ValueError):
        raw = b""
    if len(raw) != 32:
        raise ValueError(f"key {name!r}: sha256 must be 64 hex digits")
    return ApiKey(name, raw, limit)
