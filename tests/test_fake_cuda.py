"""The forward on a CUDA device, without a GPU: torch's FakeTensorMode with
a fake ``cuda`` device runs every operation's shape logic on CUDA tensors.

Every gate, in inference, eval with autograd (the lean training Function's
forward) and training, at a size the windows tile, one they do not, and one
smaller than a window: every tensor an operation reads or writes is on the
device (no CPU tensor is made in the hot path, which would be a copy and a
sync per step on a GPU), and no operation reads a value back to the host.
"""
from __future__ import annotations

import copy

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from posmlp_dense import PosMLP

from conftest import TINY_ARCH, randomize_

# operations that make the host wait for a device value
HOST_READS = {'_local_scalar_dense', 'item', 'is_nonzero', 'equal',
              'allclose', 'nonzero', 'masked_select', 'unique',
              '_unique2', 'unique_consecutive', 'repeat_interleave'}
SIZES = {'tiled': (224, 224), 'untiled': (97, 161), 'small': (33, 47)}


class _DeviceRecorder(TorchDispatchMode):
    """Records operations that touch a non-CUDA tensor, and host reads."""

    def __init__(self):
        super().__init__()
        self.off_device, self.host_reads, self.ops = [], [], 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in HOST_READS:  # (before the call: fake tensors raise)
            self.host_reads.append(name)
        out = func(*args, **(kwargs or {}))
        self.ops += 1
        tensors = [t for t in tree_flatten((args, kwargs, out))[0]
                   if isinstance(t, torch.Tensor)]
        if any(t.device.type != 'cuda' for t in tensors):
            self.off_device.append(name)
        return out


def _run(gate: str, mode: str, size) -> _DeviceRecorder:
    arch = dict(TINY_ARCH, gamma=(1, 1, 1, 1)) if gate == 'sgu' \
        else TINY_ARCH
    model = randomize_(PosMLP(arch, gate=gate, drop_path_rate=0.2))
    model.train(mode == 'train')
    recorder = _DeviceRecorder()
    twin = copy.deepcopy(model)
    with FakeTensorMode(allow_non_fake_inputs=True):
        twin.to('cuda')
        x = torch.empty(2, 3, *size, device='cuda')
        with torch.set_grad_enabled(mode != 'inference'), recorder:
            outs = twin(x)
        assert all(o.device.type == 'cuda' for o in outs)
        assert [tuple(o.shape) for o in outs] == [
            (2, d, h, w) for d, (h, w) in zip(
                arch['embed_dims'], twin.level_map_sizes(*size))]
        if mode != 'inference':
            assert all(o.requires_grad for o in outs)
    return recorder


@pytest.mark.parametrize('size', list(SIZES.values()), ids=list(SIZES))
@pytest.mark.parametrize('mode', ['inference', 'eval_grad', 'train'])
@pytest.mark.parametrize('gate', ['gqpe', 'lrpe', 'sgu'])
def test_forward_stays_on_the_device(gate, mode, size):
    recorder = _run(gate, mode, size)
    assert recorder.ops > 50
    assert recorder.off_device == []
    assert recorder.host_reads == []


def test_the_recorder_sees_a_cpu_tensor_and_a_host_read():
    """The checks above can fail: a CPU tensor in the computation and an
    ``.item()`` are both caught."""
    recorder = _DeviceRecorder()
    with FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.empty(3, device='cuda')
        with recorder:
            y = x * torch.tensor(2.0)  # a CPU scalar tensor mixes in
            with pytest.raises(Exception):
                y.sum().item()  # fake tensors have no value to give
    assert 'mul' in recorder.off_device
    assert '_local_scalar_dense' in recorder.host_reads
