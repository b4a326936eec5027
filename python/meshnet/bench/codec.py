"""Seam codec throughput: encode + decode MB/s of a large bundle, full path (tensor -> fragments
-> SeamFrame bytes -> decode -> reassemble -> tensor), written as JSON to stdout. Then the
hand-written seam codec against its descriptor-driven form (seam.descriptor_codec()), in
alternating rounds: a decode step's frame (microseconds to encode and to decode) and the F16
bundle's frames (MB/s), with each figure's ratio descriptor-driven / hand-written.

  tools/bazel run //python:codec_bench -- [--tokens 4096] [--width 8192] [--repeats 5] [--rounds 7]

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

SESSION = t.RouteSession(SessionId("bench"), 1)


def _round_trip(tensor: tensors.Tensor, compression: t.Compression) -> tuple[float, float, int]:
    session = SESSION
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


def _decode_step() -> t.SeamFrame:
    """A client's decode step to a first hop (one token, its sampling and downstream hop)."""
    ticket = t.RouteTicket(bytes(range(256)) * 2, bytes(64))
    return t.SeamFrame(seam.PROTOCOL_VERSION, SESSION, t.Phase.DECODE, 7, work_id="step-7",
                       fingerprints=t.Fingerprints("sha256:" + "a" * 64, "sha256:" + "b" * 64),
                       range=t.ShardRange(0, 10, 0), span=t.TokenSpan(41, 1), token_ids=(1234,),
                       expected_cache=t.CacheState(41), budget_ms=2500,
                       sampling=t.SamplingParams(0.75, 40, 0.875, 1, 64, (2,), 0, "", ()),  # exact in float32
                       downstream=(t.DownstreamHop("node-b", "127.0.0.1:7002", t.ShardRange(10, 20, 10), ticket),),
                       ticket=ticket)


def _timed(calls: int, call) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        call()
    return time.perf_counter() - started


def compare_codecs(tensor: tensors.Tensor, rounds: int, step_frames: int) -> dict:
    """Hand-written against descriptor-driven, alternating which goes first each round."""
    described = seam.descriptor_codec()
    codecs = {
        "hand_written": (seam.encode, lambda data: seam.decode(t.SeamFrame, data)),
        "descriptor_driven": (described.encode, lambda data: described.decode(t.SeamFrame, data)),
    }
    step = _decode_step()
    step_bytes = seam.encode(step)
    bundle_frames = [t.SeamFrame(seam.PROTOCOL_VERSION, SESSION, t.Phase.PREFILL, 1, fragment=f)
                     for f in bundle.encode_bundle([tensor], 1)]
    wire = [seam.encode(f) for f in bundle_frames]
    samples: dict[str, dict[str, list[float]]] = {name: {} for name in codecs}
    for round_index in range(rounds):
        order = list(codecs) if round_index % 2 == 0 else list(reversed(codecs))
        for name in order:
            encode, decode = codecs[name]
            assert encode(step) == step_bytes and decode(step_bytes) == step
            figures = samples[name]
            figures.setdefault("step_encode_us", []).append(_timed(step_frames, lambda: encode(step)) / step_frames * 1e6)
            figures.setdefault("step_decode_us", []).append(_timed(step_frames, lambda: decode(step_bytes)) / step_frames * 1e6)
            encode_s = _timed(1, lambda: [encode(f) for f in bundle_frames])
            decode_s = _timed(1, lambda: [decode(data) for data in wire])
            figures.setdefault("bundle_encode_mb_s", []).append(tensor.nbytes / 1e6 / encode_s)
            figures.setdefault("bundle_decode_mb_s", []).append(tensor.nbytes / 1e6 / decode_s)
    medians = {name: {k: round(statistics.median(v), 2) for k, v in figures.items()} for name, figures in samples.items()}
    hand, described_figures = medians["hand_written"], medians["descriptor_driven"]
    return {
        "rounds": rounds, "step_frames_per_round": step_frames, "step_frame_bytes": len(step_bytes),
        "bundle": {"dtype": tensor.dtype.name, "frames": len(wire), "payload_mb": round(tensor.nbytes / 1e6, 2)},
        "medians": medians,
        "ratio_descriptor_over_hand": {k: round(described_figures[k] / hand[k], 3) for k in hand},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--width", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=7, help="rounds of the codec comparison")
    parser.add_argument("--step-frames", type=int, default=2000, help="decode-step frames per round and codec")
    args = parser.parse_args()
    values = np.random.default_rng(0).standard_normal((args.tokens, args.width), dtype=np.float32)
    results = []
    comparison = None
    for dtype in (t.DType.F16, t.DType.BF16, t.DType.F32):
        source = values.astype(np.float16) if dtype == t.DType.F16 else values
        tensor = tensors.from_numpy("hidden_states", source, dtype)
        if dtype == t.DType.F16:
            comparison = compare_codecs(tensor, args.rounds, args.step_frames)
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
    print(json.dumps({"benchmark": "seam_codec_python", "results": results, "codec_comparison": comparison}, indent=2))


if __name__ == "__main__":
    main()
