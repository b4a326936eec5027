"""A node's capacity from its device's memory (ADR 0014).

Before it starts its worker, a GGUF node asks the worker binary which devices it can compute
on (`worker --list_devices=1`: name, driver, free and total bytes) and sizes what it will hold
there: the range's weights plus a KV cache, which the worker allocates in full at start. The
budget is `--device-memory` when given (what the operator lends: a gaming PC keeps the rest for
its games), else the device's free memory less a reserve for the compute buffers and the
driver. The KV cache gets what the weights leave, up to `--max-kv-tokens` (32768 when not
given); a range whose weights do not fit, or an explicit `--max-kv-tokens` that does not, is
refused before anything is loaded, with the figures. The tracker is told the device and the
resulting capacity (kv_tokens, memory_bytes) and routes by measured speed as before.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path
from typing import Optional

from meshnet.recipe.range_memory import RangeMemory
from meshnet.wire import tracker as tt

DEFAULT_KV_TOKENS = 32768
MIN_KV_TOKENS = 256  # less than this serves no useful session
# Left free on the device when no --device-memory is given: compute buffers (a few batches of
# activations and logits), the driver's own allocations, whatever else shares the device.
RESERVE_FRACTION = 0.05
RESERVE_MIN_BYTES = 256 << 20
LIST_TIMEOUT_SECONDS = 60.0


class DoesNotFit(ValueError):
    """The range, or the KV cache asked for, does not fit in the device's budget."""


@dataclasses.dataclass(frozen=True)
class DeviceBudget:
    device: tt.Device
    kv_tokens: int  # KV cells the worker allocates (its n_ctx)
    memory_bytes: int  # weights + KV the node holds on the device
    budget_bytes: int  # what it was allowed


def list_devices(worker_binary: Path, timeout: float = LIST_TIMEOUT_SECONDS) -> list[tt.Device]:
    """The devices `worker_binary` can compute on, "cpu" first. RuntimeError when it cannot say."""
    try:
        done = subprocess.run([str(worker_binary), "--list_devices=1"], capture_output=True, text=True,
                              timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise RuntimeError(f"{worker_binary} --list_devices=1: {err}") from err
    if done.returncode != 0:
        raise RuntimeError(f"{worker_binary} --list_devices=1 exited {done.returncode}: {done.stderr.strip()[-500:]}")
    try:
        rows = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
        return [tt.Device(str(r["device"]), str(r["device_description"]), int(r["device_memory_total"]),
                          int(r["device_memory_free"])) for r in rows]
    except (ValueError, KeyError, TypeError) as err:
        raise RuntimeError(f"{worker_binary} --list_devices=1 printed what is not a device list: {err}") from err


def find_device(devices: list[tt.Device], name: str) -> tt.Device:
    """The device called `name` (case-insensitive). ValueError naming those there are otherwise."""
    for device in devices:
        if device.name == name.strip().lower():
            return device
    raise ValueError(f"no device {name!r} for this worker binary (devices: {', '.join(d.name for d in devices)})")


def default_budget(device: tt.Device) -> int:
    """The device's free memory less the reserve."""
    reserve = max(RESERVE_MIN_BYTES, int(device.memory_total_bytes * RESERVE_FRACTION))
    return max(0, device.memory_free_bytes - reserve)


def plan(device: tt.Device, memory: RangeMemory, *, layers: tuple[int, int], max_kv_tokens: Optional[int] = None,
         device_memory: Optional[int] = None) -> DeviceBudget:
    """What the node holds on `device` for a range of `memory`. DoesNotFit with the figures when
    the weights, or an explicit `max_kv_tokens`, do not fit (or fewer than MIN_KV_TOKENS do)."""
    where = f"{device.name} ({device.description or 'no description'}, {mib(device.memory_free_bytes)} free)"
    budget = default_budget(device) if device_memory is None else device_memory
    if device_memory is not None and device_memory > device.memory_free_bytes:
        raise DoesNotFit(f"--device-memory {mib(device_memory)} is more than {where} has")
    need = f"layers {layers[0]}:{layers[1]} need {mib(memory.weight_bytes)} of weights"
    fit = (budget - memory.weight_bytes) // memory.kv_bytes_per_token if budget > memory.weight_bytes else 0
    if fit < MIN_KV_TOKENS:
        raise DoesNotFit(f"{need} and {mib(MIN_KV_TOKENS * memory.kv_bytes_per_token)} for {MIN_KV_TOKENS} KV "
                         f"tokens; the budget on {where} is {mib(budget)}: serve fewer layers, or use a device with "
                         f"more memory")
    if max_kv_tokens is not None and max_kv_tokens > fit:
        raise DoesNotFit(f"--max-kv-tokens {max_kv_tokens} needs {mib(max_kv_tokens * memory.kv_bytes_per_token)} "
                         f"of KV; {need}, and the budget on {where} is {mib(budget)}: at most {fit} KV tokens fit")
    kv_tokens = min(fit, DEFAULT_KV_TOKENS if max_kv_tokens is None else max_kv_tokens)
    return DeviceBudget(device, kv_tokens, memory.total(kv_tokens), budget)


def mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"
