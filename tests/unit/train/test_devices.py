"""A device without an index never reaches a `torch.cuda` call that needs one.

On 2026-12-06 every one-process arm died at start-up on every CUDA machine: accelerate's device
in a one-process launch is `cuda` (no index), and the worker handed it to
`torch.cuda.set_per_process_memory_fraction`, which refuses it. No CPU run met it. Here the
`torch.cuda` calls of the GPU path are replaced by stand-ins that check their device argument
with torch's own validator (`torch.cuda._utils._get_device_index`, the function that raised on
the GPU), so the same class of bug fails on a CPU. The current device is 1, not 0, so that a
fix that writes `cuda:0` instead of asking for the current device fails too.
"""
from __future__ import annotations

import types

import pytest
import torch
from torch.cuda._utils import _get_device_index

from gradshare.contract.plan import load_plan
from gradshare.model.evaluate import device_for
from gradshare.train.memory import GIB, cap_device_memory
from gradshare.util.devices import indexed

CURRENT = 1  # the current CUDA device of the faked machine


@pytest.fixture
def strict_cuda(monkeypatch):
    """torch.cuda's calls on the GPU path, each validating its device as torch does: `needs`
    (no `optional`) refuses a device without an index, `optional` takes it as the current one."""
    calls = []

    def needs(name):
        def call(*args):
            device = args[-1]
            calls.append((name, _get_device_index(device)))  # raises as on a GPU
        return call

    def properties(device=None):
        calls.append(("get_device_properties", _get_device_index(device, optional=True)))
        return types.SimpleNamespace(total_memory=140 * GIB)

    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", needs("set_per_process_memory_fraction"))
    monkeypatch.setattr(torch.cuda, "set_device", needs("set_device"))
    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: CURRENT)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    return calls


def test_torchs_own_validator_refuses_a_cuda_device_without_an_index():
    """The stand-ins are only as strict as torch: this is the error the GPU raised."""
    with pytest.raises(ValueError, match="Expected a torch.device with a specified index"):
        _get_device_index(torch.device("cuda"))


def test_the_allocator_cap_takes_accelerates_one_process_device(strict_cuda):
    fraction = cap_device_memory(44.0, torch.device("cuda"))  # Accelerator().device, one process
    assert fraction == pytest.approx(44 / 140)
    assert ("set_per_process_memory_fraction", CURRENT) in strict_cuda


def test_every_source_of_a_device_resolves_to_an_indexed_one(strict_cuda):
    assert indexed(torch.device("cuda")) == torch.device("cuda", CURRENT)  # accelerate, one process
    assert indexed("cuda") == torch.device("cuda", CURRENT)
    assert indexed(torch.device("cuda", 0)) == torch.device("cuda", 0)  # the one-GPU rehearsal's ranks
    assert indexed(torch.device("cpu")) == torch.device("cpu")
    assert device_for(load_plan("full")) == torch.device("cuda", CURRENT)  # score
    assert device_for(load_plan("tiny")) == torch.device("cpu")
    torch.cuda.set_device(indexed(torch.device("cuda")))  # accepted by the strict stand-in
    assert strict_cuda[-1] == ("set_device", CURRENT)


def test_nothing_is_capped_without_a_cap_or_a_gpu(strict_cuda):
    assert cap_device_memory(0, torch.device("cuda")) is None
    assert cap_device_memory(44.0, torch.device("cpu")) is None
    assert strict_cuda == []
