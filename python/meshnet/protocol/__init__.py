"""Wire protocols: conversion between protobuf messages and Meshnet's native types.

Protobuf types stop at this package; nothing outside it imports *_pb2 modules.
"""
