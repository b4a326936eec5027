"""Seam codec throughput: encode + decode MB/s of a large bundle, full path (tensor -> fragments
-> SeamFrame bytes -> decode -> reassemble -> tensor), written as JSON to stdout.

  tools/bazel run //python:codec_bench -- [--tokens 4096] [--width 8192] [--repeats 5]

A measurement, never a test: this machine is noisy, so compare lanes of the same run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from meshnet.protocol import bundle, seam, tensors
from meshnet.wire import seam as t
from meshnet.wire.ids import SessionId


def _round_trip(tensor: tensors.Tensor, compression: t.Compression) -> tuple[float, float, int]:
    session = t.RouteSession(SessionId("bench"), 1)
    started = time.perf_counter()
    fragments = bundle.encode_bundle([tensor], 1, compression=compression)
    frames = [seam.encode(t.SeamFrame(seam.PROTOCOL_VERSION, session, t.Phase.PREFILL, 1, fragment=f)) for f in fragments]
    encoded = time.perf_counter()
    r = bundle.Reassembler()
    out = None
    for data in frames:
        out = r.add(seam.decode_seam_frame(data).fragment)
    done = time.perf_counter()
    assert out is not None and bytes(out[0].data) == bytes(tensor.data)
    return encoded - started, done - encoded, sum(len(f) for f in frames)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--width", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    values = np.random.default_rng(0).standard_normal((args.tokens, args.width), dtype=np.float32)
    results = []
    for dtype in (t.DType.F16, t.DType.BF16, t.DType.F32):
        source = values.astype(np.float16) if dtype == t.DType.F16 else values
        tensor = tensors.from_numpy("hidden_states", source, dtype)
        for compression in (t.Compression.NONE, t.Compression.ZLIB):
            runs = [_round_trip(tensor, compression) for _ in range(args.repeats if compression == t.Compression.NONE else 1)]
            encode_s = statistics.median(r[0] for r in runs)
            decode_s = statistics.median(r[1] for r in runs)
            mb = tensor.nbytes / 1e6
            results.append({
                "dtype": dtype.name, "compression": compression.name, "shape": [args.tokens, args.width],
                "payload_mb": round(mb, 2), "wire_mb": round(runs[0][2] / 1e6, 2), "repeats": len(runs),
                "encode_mb_s": round(mb / encode_s, 1), "decode_mb_s": round(mb / decode_s, 1),
                "encode_plus_decode_mb_s": round(mb / (encode_s + decode_s), 1),
            })
    print(json.dumps({"benchmark": "seam_codec_python", "results": results}, indent=2))


if __name__ == "__main__":
    main()
