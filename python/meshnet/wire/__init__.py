"""Shared vocabulary of every role: ids, ranges, statuses, and the native mirrors of the wire
messages (`seam`, `tracker`), which meshnet.protocol converts to and from protobuf.

Pure data (frozen dataclasses, enums, NewTypes); no role's internals and no protobuf here.
(Named `wire`, not `types`, so it never shadows the standard library's `types`.)
"""
