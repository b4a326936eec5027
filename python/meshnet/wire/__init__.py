"""Shared vocabulary of every role: ids, ranges, statuses and the native seam types.

Pure data (frozen dataclasses, enums, NewTypes); no role's internals and no protobuf here.
"""
