"""Property-based fuzzing of the seam decoder and the reassembler (hypothesis, derandomized).

Over 12,000 inputs: random bytes, byte-level mutations of valid encoded frames, and structurally
valid frames with random field values. The only acceptable outcomes are a decoded value or a
ProtocolError with a non-empty message; any other exception is a crash and fails the test.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshnet.protocol import bundle, seam, tensors
from meshnet.protocol.errors import ProtocolError
from meshnet.wire import seam as t
from meshnet.wire.ids import SessionId

EXAMPLES = 4000
SMALL_LIMITS = bundle.Limits(max_fragment_bytes=256, max_bundle_bytes=8192, max_tensors=4)
SETTINGS = settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
                    suppress_health_check=list(HealthCheck))


def _corpus() -> list[list[bytes]]:
    """Valid frame sequences (each one bundle, several fragments) to mutate."""
    rng = np.random.default_rng(5)
    out = []
    for compression in (t.Compression.NONE, t.Compression.ZLIB):
        parts = [tensors.from_numpy("h", rng.standard_normal((3, 40), dtype=np.float32)),
                 tensors.from_numpy("g", rng.standard_normal((2, 8)).astype(np.float16))]
        fragments = bundle.encode_bundle(parts, 77, compression=compression, fragment_bytes=96, limits=SMALL_LIMITS)
        session = t.RouteSession(SessionId("fuzz"), 1)
        out.append([seam.encode(t.SeamFrame(seam.PROTOCOL_VERSION, session, t.Phase.PREFILL, 1, fragment=f))
                    for f in fragments])
    return out


CORPUS = _corpus()


def _feed(frames: list[bytes]) -> None:
    """Decodes frames and reassembles their fragments; only ProtocolError may escape here."""
    r = bundle.Reassembler(SMALL_LIMITS)
    for data in frames:
        try:
            frame = seam.decode_seam_frame(data)
            if frame.fragment is not None:
                r.add(frame.fragment)
        except ProtocolError as err:
            assert err.status.message
    try:
        r.finish()
    except ProtocolError as err:
        assert err.status.message


def test_random_bytes():
    seen = 0

    @SETTINGS
    @given(st.lists(st.binary(max_size=600), min_size=1, max_size=4))
    def check(frames):
        nonlocal seen
        seen += 1
        _feed(frames)

    check()
    assert seen >= EXAMPLES


mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10_000), st.integers(0, 7)),
    st.tuples(st.just("truncate"), st.integers(0, 10_000), st.just(0)),
    st.tuples(st.just("insert"), st.integers(0, 10_000), st.integers(0, 255)),
    st.tuples(st.just("delete"), st.integers(0, 10_000), st.integers(1, 16)),
)


def _mutate(data: bytes, op: tuple[str, int, int]) -> bytes:
    kind, pos, arg = op
    pos = pos % (len(data) + 1)
    if kind == "flip" and data:
        pos %= len(data)
        return data[:pos] + bytes([data[pos] ^ (1 << arg)]) + data[pos + 1:]
    if kind == "truncate":
        return data[:pos]
    if kind == "insert":
        return data[:pos] + bytes([arg]) + data[pos:]
    return data[:pos] + data[pos + arg:]


def test_mutated_valid_frames():
    seen = 0

    @SETTINGS
    @given(st.integers(0, len(CORPUS) - 1), st.integers(0, 100), st.lists(mutation, min_size=1, max_size=4),
           st.booleans())
    def check(which, target, ops, shuffle):
        nonlocal seen
        seen += 1
        frames = list(CORPUS[which])
        index = target % len(frames)
        for op in ops:
            frames[index] = _mutate(frames[index], op)
        if shuffle:
            frames = frames[1:] + frames[:1]
        _feed(frames)

    check()
    assert seen >= EXAMPLES


spec_strategy = st.builds(
    t.TensorSpec,
    name=st.text(max_size=140),
    dtype=st.integers(0, 5),
    shape=st.lists(st.integers(0, 1 << 40), max_size=6).map(tuple),
    byte_order=st.integers(0, 3),
    offset=st.integers(0, 1 << 20),
    length=st.integers(0, 1 << 62),
    crc32=st.integers(0, (1 << 32) - 1),
)
header_strategy = st.builds(
    t.BundleHeader,
    tensors=st.lists(spec_strategy, max_size=6).map(tuple),
    compression=st.integers(0, 3),
    payload_bytes=st.integers(0, 1 << 62),
    wire_bytes=st.integers(0, 1 << 40),
)
fragment_strategy = st.builds(
    t.TensorFragment,
    bundle_id=st.integers(0, 3),
    index=st.integers(0, 5),
    count=st.integers(0, 1 << 31),
    header=st.none() | header_strategy,
    data=st.binary(max_size=300),
)


def test_structured_random_fragments():
    seen = 0

    @SETTINGS
    @given(st.lists(fragment_strategy, min_size=1, max_size=5))
    def check(fragments):
        nonlocal seen
        seen += 1
        frames = []
        for f in fragments:
            frame = t.SeamFrame(seam.PROTOCOL_VERSION, t.RouteSession(SessionId("s"), 1), t.Phase.DECODE, 1, fragment=f)
            frames.append(seam.encode(frame))
        _feed(frames)

    check()
    assert seen >= EXAMPLES
