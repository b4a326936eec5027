"""The shard's supervision calls, Health and TakeWork: meshnet.shard.v1 protobuf <-> native types.

Used by the typed shard client (shard_client.py) and the shard service adapter
(shard_service.py); nothing else sees these protobuf types. Health decodes every field of
HealthReply; an absent status or step_times is None. A Health reply is an answer whatever its
status says: a status code this peer does not know (a newer worker's) reads as UNSPECIFIED with
the number in its message, so a node, its /metrics and the bench never fail on one. A TakeWork entry always has a session (an
absent one reads as the empty session, as protobuf reads it).
"""

from __future__ import annotations

from typing import Iterable

from meshnet.protocol.errors import ProtocolError
from meshnet.protocol.seam import status_in, status_out
from meshnet.wire.status import Status, StatusCode
from meshnet.shard.v1 import shard_pb2 as pb
from meshnet.wire import seam as t
from meshnet.wire import tracker as tt
from meshnet.wire.ids import SessionId


def _step_times_in(m: pb.StepTimes) -> t.StepTimes:
    return t.StepTimes(steps=m.steps, admit_us=m.admit_us, wait_us=m.wait_us, after_us=m.after_us,
                       send_us=m.send_us, reply_us=m.reply_us, queue_us=m.queue_us, engine_us=m.engine_us)


def _step_times_out(v: t.StepTimes) -> pb.StepTimes:
    return pb.StepTimes(steps=v.steps, admit_us=v.admit_us, wait_us=v.wait_us, after_us=v.after_us,
                        send_us=v.send_us, reply_us=v.reply_us, queue_us=v.queue_us, engine_us=v.engine_us)


def _health_status_in(m: pb.Status) -> Status:
    try:
        return status_in(m)
    except ProtocolError:  # a code a newer peer knows: still an answer
        pass
    return Status(StatusCode.UNSPECIFIED, f"status code {m.code} unknown to this peer: {m.message}", m.retryable, m.hop)


def health_in(m: pb.HealthReply) -> t.Health:
    return t.Health(
        status=_health_status_in(m.status) if m.HasField("status") else None,
        active_sessions=m.active_sessions, queue_depth=m.queue_depth, kv_cells_used=m.kv_cells_used,
        kv_cells_total=m.kv_cells_total, batches=m.batches, mean_batch_rows=m.mean_batch_rows,
        max_batch_sessions=m.max_batch_sessions, compute_us=m.compute_us, seam_frames_in=m.seam_frames_in,
        seam_bytes_in=m.seam_bytes_in, fence_entries=m.fence_entries, results_readers=m.results_readers,
        drafted_tokens=m.drafted_tokens, accepted_drafts=m.accepted_drafts, rewound_rows=m.rewound_rows,
        device=m.device, device_description=m.device_description, device_memory_used=m.device_memory_used,
        device_memory_free=m.device_memory_free, device_memory_total=m.device_memory_total,
        step_times=_step_times_in(m.step_times) if m.HasField("step_times") else None)


def health_out(v: t.Health) -> pb.HealthReply:
    m = pb.HealthReply(
        active_sessions=v.active_sessions, queue_depth=v.queue_depth, kv_cells_used=v.kv_cells_used,
        kv_cells_total=v.kv_cells_total, batches=v.batches, mean_batch_rows=v.mean_batch_rows,
        max_batch_sessions=v.max_batch_sessions, compute_us=v.compute_us, seam_frames_in=v.seam_frames_in,
        seam_bytes_in=v.seam_bytes_in, fence_entries=v.fence_entries, results_readers=v.results_readers,
        drafted_tokens=v.drafted_tokens, accepted_drafts=v.accepted_drafts, rewound_rows=v.rewound_rows,
        device=v.device, device_description=v.device_description, device_memory_used=v.device_memory_used,
        device_memory_free=v.device_memory_free, device_memory_total=v.device_memory_total)
    if v.status is not None:
        m.status.SetInParent()
        status_out(v.status, m.status)
    if v.step_times is not None:
        m.step_times.CopyFrom(_step_times_out(v.step_times))  # present, even when all zero
    return m


def work_in(m: pb.TakeWorkReply) -> tuple[tt.WorkEntry, ...]:
    return tuple(tt.WorkEntry(t.RouteSession(SessionId(w.session.session_id), w.session.epoch), w.prefill_tokens,
                              w.decode_tokens) for w in m.work)


def work_out(entries: Iterable[tt.WorkEntry]) -> pb.TakeWorkReply:
    """Entries without a session are sent with the empty one."""
    m = pb.TakeWorkReply()
    for e in entries:
        session = e.session or t.RouteSession(SessionId(""), 0)
        m.work.add(session=pb.RouteSession(session_id=session.session_id, epoch=session.epoch),
                   prefill_tokens=e.prefill_tokens, decode_tokens=e.decode_tokens)
    return m

