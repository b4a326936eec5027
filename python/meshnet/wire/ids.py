"""Identifier types shared by all roles (NewTypes: free at run time, checked by mypy)."""

from typing import NewType

SessionId = NewType("SessionId", str)  # a route session, issued by the tracker
NodeId = NewType("NodeId", str)  # a registered node
