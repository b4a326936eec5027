"""A node's capacity from its device's memory: the worker's device list, and what fits there."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from meshnet.node.device_budget import (DEFAULT_KV_TOKENS, MIN_KV_TOKENS, RESERVE_MIN_BYTES, DoesNotFit,
                                        default_budget, find_device, list_devices, plan)
from meshnet.recipe.range_memory import RangeMemory
from meshnet.wire import tracker as tt

MIB = 1 << 20
GPU = tt.Device("vulkan0", "Radeon 8060S", 8192 * MIB, 8000 * MIB)
RANGE = RangeMemory(weight_bytes=3000 * MIB, kv_bytes_per_token=128 * 1024)  # 8 tokens per MiB


def test_the_worker_lists_the_cpu_first_with_its_memory():
    devices = list_devices(Path(os.environ["MESHNET_WORKER_BINARY"]))
    assert devices[0].name == "cpu" and devices[0].memory_total_bytes > 0
    assert 0 < devices[0].memory_free_bytes <= devices[0].memory_total_bytes
    assert find_device(devices, "CPU") == devices[0]
    with pytest.raises(ValueError, match="no device 'vulkan7'.*devices: cpu"):
        find_device(devices, "vulkan7")


def test_a_binary_that_cannot_list_is_a_clear_error(tmp_path):
    with pytest.raises(RuntimeError, match="--list_devices=1"):
        list_devices(tmp_path / "missing-worker")


def test_the_default_budget_leaves_a_reserve():
    assert default_budget(GPU) == 8000 * MIB - max(RESERVE_MIN_BYTES, int(8192 * MIB * 0.05))
    assert default_budget(tt.Device("cpu", "", 100 * MIB, 100 * MIB)) == 0


def test_kv_gets_what_the_weights_leave_up_to_the_default():
    budget = plan(GPU, RANGE, layers=(0, 10))
    fit = (default_budget(GPU) - RANGE.weight_bytes) // RANGE.kv_bytes_per_token
    assert budget.kv_tokens == DEFAULT_KV_TOKENS < fit  # 4590 MiB left: 36723 would fit, capped
    assert budget.memory_bytes == RANGE.weight_bytes + budget.kv_tokens * RANGE.kv_bytes_per_token
    small = plan(GPU, RANGE, layers=(0, 10), device_memory=3500 * MIB)
    assert small.kv_tokens == 500 * 8 and small.memory_bytes <= 3500 * MIB and small.budget_bytes == 3500 * MIB


def test_an_explicit_kv_size_is_kept_when_it_fits():
    assert plan(GPU, RANGE, layers=(0, 10), max_kv_tokens=1000).kv_tokens == 1000


def test_weights_that_do_not_fit_are_refused_with_the_figures():
    with pytest.raises(DoesNotFit, match=r"layers 0:10 need 3000.0 MiB of weights.*budget on vulkan0 "
                                         r"\(Radeon 8060S, 8000.0 MiB free\) is 2000.0 MiB"):
        plan(GPU, RANGE, layers=(0, 10), device_memory=2000 * MIB)
    room_for_too_few = 3000 * MIB + (MIN_KV_TOKENS - 1) * RANGE.kv_bytes_per_token
    with pytest.raises(DoesNotFit):
        plan(GPU, RANGE, layers=(0, 10), device_memory=room_for_too_few)


def test_a_kv_size_that_does_not_fit_says_what_would():
    with pytest.raises(DoesNotFit, match="--max-kv-tokens 5000 needs 625.0 MiB of KV.*at most 4000 KV tokens fit"):
        plan(GPU, RANGE, layers=(0, 10), device_memory=3500 * MIB, max_kv_tokens=5000)


def test_more_memory_than_the_device_has_free_is_refused():
    with pytest.raises(DoesNotFit, match="--device-memory 9000.0 MiB is more than vulkan0"):
        plan(GPU, RANGE, layers=(0, 10), device_memory=9000 * MIB)
