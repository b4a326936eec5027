"""The roles a tracker tells apart by their bearer token, and fresh tokens for them.

A tracker maps each role to one shared token (`--role-tokens`); the node, client, gateway and
verifier present theirs on every call. Local swarms and tests make a fresh set per run.
"""

from __future__ import annotations

import secrets

ROLES = ("node", "client", "gateway", "verifier")


def new_role_tokens() -> dict[str, str]:
    """A fresh, distinct token per role (for local swarms and tests)."""
    return {role: secrets.token_hex(16) for role in ROLES}
