"""Writes the seam protocol's golden frames (tests/golden/*.bin and MANIFEST).

  tools/bazel run //tools/golden:make_golden_frames            # rewrites tests/golden/
  tools/bazel run //tools/golden:make_golden_frames -- --out DIR

Deterministic: fixed seeds, fixed ids. Python and C++ tests decode every frame and re-encode it
byte-identical; //tests:golden_frames_test also regenerates them and compares with the checked-in
files, so any change to the encoding shows up as a diff that must be committed deliberately.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

from meshnet.protocol import bundle, seam, tensors
from meshnet.wire import seam as t
from meshnet.wire.ids import SessionId
from meshnet.wire.status import Status, StatusCode

V1 = t.ProtocolVersion(1, 0)  # the frames a 1.0 peer sent: still accepted, byte for byte
V1_1 = t.ProtocolVersion(1, 1)  # docs/adr/0021-the-route-decided-once.md
SESSION = t.RouteSession(SessionId("golden-session-0001"), 2)
FINGERPRINTS = t.Fingerprints("sha256:" + "ab" * 32, "sha256:" + "cd" * 32)
N_EMBD = 16


def _hidden(seed: int, tokens: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((tokens, N_EMBD), dtype=np.float32)


def _frame(step: int, phase: t.Phase, fragment: t.TensorFragment, span: t.TokenSpan) -> t.SeamFrame:
    return t.SeamFrame(V1, SESSION, phase, step, f"golden-w{step}", FINGERPRINTS, t.ShardRange(10, 20, 10), span,
                       expected_cache=t.CacheState(span.start), budget_ms=1500, fragment=fragment)


def golden_messages() -> list[tuple[str, object]]:
    prefill = bundle.encode_bundle([tensors.from_numpy("hidden_states", _hidden(1, 6), t.DType.F16)], 101,
                                   fragment_bytes=128)
    (decode_f32,) = bundle.encode_bundle([tensors.from_numpy("hidden_states", _hidden(2, 1))], 102)
    (decode_bf16,) = bundle.encode_bundle([tensors.from_numpy("hidden_states", _hidden(3, 1), t.DType.BF16)], 103)
    (zlib_f32,) = bundle.encode_bundle([tensors.from_numpy("hidden_states", np.round(_hidden(4, 4), 1))], 104,
                                       compression=t.Compression.ZLIB)
    (two,) = bundle.encode_bundle([tensors.from_numpy("hidden_states", _hidden(5, 2)),
                                   tensors.from_numpy("residual_scale", np.ones((2,), np.float16))], 105)
    sampling = t.SamplingParams(0.75, 40, 0.875, 1234, 64, (2,), 2)
    return [
        ("hello_request.bin", t.HelloRequest((t.ProtocolVersion(1, 0),), ("compression.zlib", "logprobs"), "client-a")),
        ("hello_reply.bin", t.HelloReply(V1, ("compression.zlib",), "node-b", Status(StatusCode.OK))),
        ("prefill_first_hop_tokens.bin", t.SeamFrame(V1, SESSION, t.Phase.PREFILL, 1, "golden-w1", FINGERPRINTS,
                                                     t.ShardRange(0, 10, 0), t.TokenSpan(0, 6), (1, 504, 3458, 282, 4649, 314),
                                                     t.CacheState(0), 3000, sampling, None,
                                                     (t.DownstreamHop("node-b", "127.0.0.1:7702", t.ShardRange(10, 20, 10)),
                                                      t.DownstreamHop("node-c", "127.0.0.1:7703", t.ShardRange(20, 30, 20))))),
        ("prefill_f16_fragment0.bin", _frame(1, t.Phase.PREFILL, prefill[0], t.TokenSpan(0, 6))),
        ("prefill_f16_fragment1.bin", _frame(1, t.Phase.PREFILL, prefill[1], t.TokenSpan(0, 6))),
        ("decode_f32.bin", _frame(2, t.Phase.DECODE, decode_f32, t.TokenSpan(6, 1))),
        ("decode_bf16.bin", _frame(3, t.Phase.DECODE, decode_bf16, t.TokenSpan(7, 1))),
        ("decode_f32_zlib.bin", _frame(4, t.Phase.DECODE, zlib_f32, t.TokenSpan(8, 4))),
        ("decode_two_tensors.bin", _frame(5, t.Phase.DECODE, two, t.TokenSpan(12, 2))),
        ("release.bin", t.SeamFrame(V1, SESSION, t.Phase.RELEASE, 6, "golden-w6")),
        ("cancel.bin", t.SeamFrame(V1, SESSION, t.Phase.CANCEL, 7, "golden-w7")),
        ("reply_ok.bin", t.SeamReply(V1, SESSION, 2, 4, t.CacheState(7), Status(StatusCode.OK))),
        ("reply_stale_epoch.bin", t.SeamReply(V1, SESSION, 2, 0, None,
                                              Status(StatusCode.STALE_EPOCH, "epoch 2 is older than 3", False, "node-b"))),
        ("reply_replayed.bin", t.SeamReply(V1, SESSION, 2, 4, t.CacheState(7), Status(StatusCode.OK), True)),
        ("results_request.bin", t.ResultsRequest(V1, SESSION)),
        ("result_tokens.bin", t.ResultFrame(V1, SESSION, 2, (t.SampledToken(
            3458, 6, -0.125, (t.TokenLogprob(3458, -0.125), t.TokenLogprob(282, -2.25))),))),
        ("result_finished.bin", t.ResultFrame(V1, SESSION, 9, (t.SampledToken(2, 13, -0.5),), t.FinishReason.STOP,
                                              Status(StatusCode.OK))),
        # Minor 1: the later hops' tickets only (the first hop's last: the route rings), no work_id,
        # fingerprints, range or expected cache; the last hop ends with LENGTH outside the ring too.
        ("prefill_minor1_ring.bin", t.SeamFrame(
            V1_1, SESSION, t.Phase.PREFILL, 1, span=t.TokenSpan(0, 6), token_ids=(1, 504, 3458, 282, 4649, 314),
            budget_ms=3000, sampling=sampling,
            downstream=tuple(t.DownstreamHop("", "", None, t.RouteTicket(f"ticket-{hop}".encode(), bytes([i]) * 64))
                             for i, hop in enumerate(("node-b", "node-c", "node-a"), 1)),
            ticket=t.RouteTicket(b"ticket-node-a", bytes(64)), ring=True, draft_max=4)),
        ("result_length.bin", t.ResultFrame(V1_1, SESSION, 64, (t.SampledToken(4649, 69, -0.25),),
                                            t.FinishReason.LENGTH, Status(StatusCode.OK))),
    ]


def write(out: Path) -> list[str]:
    out.mkdir(parents=True, exist_ok=True)
    lines = ["# Golden seam frames: <file> <message>. Made by tools/golden/make_golden_frames.py; do not edit."]
    for name, message in golden_messages():
        (out / name).write_bytes(seam.encode(message))
        lines.append(f"{name} {type(message).__name__}")
    (out / "MANIFEST").write_text("\n".join(lines) + "\n")
    return lines[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    workspace = os.environ.get("BUILD_WORKSPACE_DIRECTORY", ".")
    parser.add_argument("--out", type=Path, default=Path(workspace) / "tests" / "golden")
    args = parser.parse_args()
    for line in write(args.out):
        print(f"wrote {args.out / line.split()[0]}")


if __name__ == "__main__":
    main()
