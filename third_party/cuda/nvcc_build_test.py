"""CI's build check of ggml-cuda (issue 30 point 6): the whole backend is hours of nvcc on 2 cores,
so CI compiles its entry file, ggml-cuda.cu (the backend's registry, device and buffer code, and
its kernels), with the rule, flags and pins every CUDA target uses, and checks what came out: the
backend's registry entry point, and one cubin (machine code, not PTX) per architecture of
@cuda_toolkit, read from the object's fat binary."""

from __future__ import annotations

import os
import struct
import subprocess
import tempfile
from pathlib import Path

OBJECT = Path(os.environ["MESHNET_CUDA_OBJECT"])
ARCHS = sorted(int(a) for a in os.environ["MESHNET_CUDA_ARCHS"].split(","))
FATBIN_MAGIC = 0xBA55ED50
CUBIN = 2  # a fat binary entry's kind: 1 PTX, 2 ELF (cubin)


def fatbin_entries(data: bytes) -> list[tuple[int, int]]:
    """(kind, sm) of every entry of the fat binaries in an object's .nv_fatbin section: each is
    a header (magic, version, header size, size) and entries (kind, version, header size,
    padded payload size, ..., sm at byte 28) back to back."""
    entries, offset = [], 0
    while offset + 16 <= len(data):
        magic, _, header, size = struct.unpack_from("<IHHQ", data, offset)
        assert magic == FATBIN_MAGIC, f"no fat binary header at {offset}"
        at, end = offset + header, offset + header + size
        while at < end:
            kind, _, entry_header, padded = struct.unpack_from("<HHII", data, at)
            entries.append((kind, struct.unpack_from("<I", data, at + 28)[0]))
            at += entry_header + padded
        offset = end
    return entries


def test_the_backend_entry_is_built_for_every_architecture():
    with tempfile.TemporaryDirectory() as tmp:
        section = Path(tmp) / "fatbin"
        subprocess.run(["objcopy", "-O", "binary", "--only-section=.nv_fatbin", str(OBJECT), str(section)], check=True)
        entries = fatbin_entries(section.read_bytes())
    assert sorted(sm for kind, sm in entries if kind == CUBIN) == ARCHS, entries


def test_the_object_defines_the_backend_registry():
    symbols = subprocess.run(["nm", "--defined-only", str(OBJECT)], capture_output=True, text=True, check=True).stdout
    assert any(line.split()[-1] == "ggml_backend_cuda_reg" for line in symbols.splitlines() if line.strip())
