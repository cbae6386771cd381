"""Device-independent GPU figures of one step: the ATen operations that
launch work (on a GPU in eager mode each is at least one kernel launch),
the bytes they write, the host syncs, the FLOPs, in fp32 and under
bfloat16 autocast; and the time they imply on a named GPU. What counts as
what is set out in docs/performance.md, "GPU proxy"."""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import warnings
from typing import Callable, Dict, Sequence, Tuple

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

from .steps import STEP_MODES, make_input, make_step, set_mode, step_name

aten = torch.ops.aten

# Allocations without a fill, and operators that change only a tensor's
# metadata without being declared views: no kernel runs.
METADATA_ONLY = frozenset({
    aten.empty, aten.empty_like, aten.empty_strided, aten.empty_permuted,
    aten.new_empty, aten.new_empty_strided, aten.resize_, aten.set_,
    aten._unsafe_view, aten.lift_fresh,
})
# Operators that make the host read device data.
HOST_READS = frozenset({
    aten._local_scalar_dense, aten.is_nonzero, aten.equal, aten.allclose,
    aten.nonzero, aten.masked_select, aten.unique_consecutive,
    aten.unique_dim, aten._unique, aten._unique2, aten.unique_dim_consecutive,
})
# Indexing operators that turn a boolean mask into indices (nonzero inside).
MASK_INDEXING = frozenset({aten.index, aten.index_put, aten.index_put_,
                           aten._index_put_impl_})

# (mode, (batch, height, width)); at 448x672 every level of PosMLP-T and
# Swin-T tiles by whole windows: neither pads.
STEPS = (('inference', (1, 800, 1333)), ('inference', (2, 512, 512)),
         ('train', (2, 512, 512)), ('train', (2, 800, 1333)),
         ('inference', (1, 448, 672)), ('train', (2, 448, 672)))
MODELS = ('posmlp_t', 'swin_t', 'resnet50')
PRECISIONS = ('fp32', 'bf16')


def _is_metadata_only(func) -> bool:
    return (func.is_view or torch.Tag.inplace_view in func.tags
            or func.overloadpacket in METADATA_ONLY)


def _is_host_sync(func, args, kwargs, out) -> bool:
    packet = func.overloadpacket
    if packet in HOST_READS:
        return True
    if func is aten.repeat_interleave.Tensor:
        return kwargs.get('output_size') is None
    if packet in MASK_INDEXING:
        indices = args[1] if len(args) > 1 else kwargs.get('indices', ())
        return any(isinstance(i, torch.Tensor)
                   and i.dtype in (torch.bool, torch.uint8) for i in indices)
    if packet in (aten._to_copy, aten.copy_):  # device to host
        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        ins = [t for t in tree_leaves((args, kwargs))
               if isinstance(t, torch.Tensor)]
        return (any(t.device.type == 'cpu' for t in outs)
                and any(t.device.type not in ('cpu', 'meta') for t in ins))
    return False


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).replace('torch.', '', 1)


class OpCounter(TorchDispatchMode):
    """Counts the ATen operations run inside it: ``ops`` that launch work,
    ``bytes_written``, ``syncs``, per operator, per dtype, and the FLOPs
    of FlopCounterMode's operators by the dtype of their first operand."""

    def __init__(self):
        super().__init__()
        self.ops = 0
        self.bytes_written = 0
        self.syncs = 0
        self.by_op: Dict[str, int] = {}
        self.syncs_by_op: Dict[str, int] = {}
        self.bytes_by_dtype: Dict[str, int] = {}
        self.flops_by_dtype: Dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if _is_metadata_only(func):
            return out
        tensors = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        sync = _is_host_sync(func, args, kwargs, out)
        if not tensors and not sync:
            return out  # a query of sizes or strides: no data read
        name = str(func.overloadpacket).replace('aten.', '', 1)
        if func.overloadpacket in flop_registry:
            operand = next(t for t in tree_leaves((args, kwargs))
                           if isinstance(t, torch.Tensor))
            dtype = _dtype_name(operand)
            self.flops_by_dtype[dtype] = self.flops_by_dtype.get(dtype, 0) \
                + flop_registry[func.overloadpacket](*args, **kwargs,
                                                     out_val=out)
        self.ops += 1
        self.by_op[name] = self.by_op.get(name, 0) + 1
        for t in tensors:
            size = t.numel() * t.element_size()
            dtype = _dtype_name(t)
            self.bytes_written += size
            self.bytes_by_dtype[dtype] = self.bytes_by_dtype.get(dtype, 0) \
                + size
        if sync:
            self.syncs += 1
            self.syncs_by_op[name] = self.syncs_by_op.get(name, 0) + 1
        return out


@dataclasses.dataclass(frozen=True)
class GpuSpec:
    """What the time estimate assumes about a GPU (see ``estimate``)."""
    name: str
    launch_s: float      # host time per operation in eager mode, seconds
    bandwidth: float     # memory bandwidth, bytes per second
    peak_flops: float    # fp32 arithmetic rate, FLOP per second
    peak_bf16_flops: float  # dense bfloat16 (tensor-core) rate, FLOP/s
    sources: Tuple[Tuple[str, str], ...] = ()  # (constant, where from)


H200 = GpuSpec(
    name='NVIDIA H200 SXM', launch_s=5e-6, bandwidth=4.8e12,
    peak_flops=67e12, peak_bf16_flops=989e12,
    sources=(
        ('launch_s', "the host's share of one eager PyTorch operation on a "
         'CUDA device (Python, the dispatcher, the caching allocator, '
         "cudaLaunchKernel), issue 30's figure; an assumption, not "
         'measured on this GPU'),
        ('bandwidth', "HBM3e bandwidth of the H200 SXM, NVIDIA's H200 "
         'datasheet'),
        ('peak_flops', "FP32 (not tensor-core) rate of the H200 SXM, "
         "NVIDIA's H200 datasheet; torch's default fp32 matmuls do not use "
         'TF32'),
        ('peak_bf16_flops', 'BF16 tensor-core rate of the H200 SXM without '
         "sparsity, half the 1,979 TFLOP/s NVIDIA's H200 datasheet gives "
         'with 2:4 sparsity; the rate of the FLOPs that run in bfloat16 '
         '(the rest at the FP32 rate)'),
    ))


def estimate(ops: int, bytes_written: int, flops: float,
             spec: GpuSpec = H200, bf16_flops: float = 0.0) -> dict:
    """Seconds of one step on ``spec``'s GPU: the host launches ahead of
    a device that runs its kernels one after another, so the longer of
    launch = ops x launch_s and memory + compute (``bound`` says which)."""
    launch = ops * spec.launch_s
    memory = bytes_written / spec.bandwidth
    if not 0 <= bf16_flops <= flops:
        raise ValueError(f'bf16_flops {bf16_flops} is not part of the '
                         f'{flops} FLOPs')
    compute = (flops - bf16_flops) / spec.peak_flops \
        + bf16_flops / spec.peak_bf16_flops
    device = memory + compute
    return dict(launch_s=launch, memory_s=memory, compute_s=compute,
                estimate_s=max(launch, device),
                bound='launch' if launch >= device else 'device')


def count_call(step, x) -> dict:
    """OpCounter's and FlopCounterMode's counts of one ``step(x)``."""
    from torch.utils.flop_counter import FlopCounterMode
    flops = FlopCounterMode(display=False)
    with flops, OpCounter() as ops:
        step(x)
    return dict(ops=ops.ops, bytes_written=ops.bytes_written,
                syncs=ops.syncs, flops=flops.get_total_flops(),
                by_op=dict(sorted(ops.by_op.items(), key=lambda kv: -kv[1])),
                syncs_by_op=ops.syncs_by_op,
                bytes_by_dtype=dict(sorted(ops.bytes_by_dtype.items())),
                flops_by_dtype=dict(sorted(ops.flops_by_dtype.items())))


@contextlib.contextmanager
def autocast_enabled(device_type: str, dtype: torch.dtype = torch.bfloat16):
    """Autocast to ``dtype`` for ``device_type``, as ``torch.autocast``
    switches it on, but also for 'cuda' without a GPU (fake CUDA tensors),
    where ``torch.autocast('cuda')`` stays off."""
    enabled = torch.is_autocast_enabled(device_type)
    previous = torch.get_autocast_dtype(device_type)
    torch.set_autocast_enabled(device_type, True)
    torch.set_autocast_dtype(device_type, dtype)
    torch.autocast_increment_nesting()
    try:
        yield
    finally:
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()  # the cast weights
        torch.set_autocast_enabled(device_type, enabled)
        torch.set_autocast_dtype(device_type, previous)


def forward_in(precision: str, model: nn.Module,
               device_type: str) -> Callable[[torch.Tensor], object]:
    """``model``'s forward in ``precision``: the model itself for fp32,
    for bf16 its call inside ``autocast_enabled(device_type)``."""
    if precision not in PRECISIONS:
        raise ValueError(f'unknown precision {precision!r}; choose from '
                         f'{PRECISIONS}')
    if precision == 'fp32':
        return model

    def forward(x):
        with autocast_enabled(device_type):
            return model(x)
    return forward


# Where a step is counted: real tensors on the CPU or a CUDA device, or
# fake CUDA tensors (FakeTensorMode: shapes without data), which need no GPU.
PLACES = ('cpu', 'cuda', 'fake-cuda')


def counting_place(mode: str, device: torch.device) -> str:
    """Where a step of ``mode`` is counted so that the counts follow the
    models' CUDA code path (PosMLP-T's stem, for one, differs on a CPU):
    real CUDA tensors on a GPU; without one, fake CUDA tensors for
    inference and the CPU for training (autograd's engine needs a GPU for
    a backward on CUDA tensors, fake or not)."""
    if device.type == 'cuda':
        return 'cuda'
    return 'fake-cuda' if mode == 'inference' else 'cpu'


def count_step(model: nn.Module, mode: str, shape: Sequence[int],
               place: str = 'cpu', seed: int = 0,
               precision: str = 'fp32') -> dict:
    """Counts (``count_call``) of one step of ``model``, input ``shape`` =
    (B, H, W), at ``place`` (the model must be there, or for 'fake-cuda'
    a copy goes), in ``precision`` (bf16: autocast with the policy of the
    place's device type). An uncounted step first fills the caches, as in
    a loop."""
    if place not in PLACES:
        raise ValueError(f'unknown place {place!r}; choose from {PLACES}')
    if place == 'fake-cuda' and mode != 'inference':
        raise ValueError('a backward on fake CUDA tensors needs a GPU (the '
                         'autograd engine starts a CUDA thread): count '
                         f'{mode} steps on real tensors')
    batch, h, w = shape
    step_mode = STEP_MODES[mode]
    device_type = 'cpu' if place == 'cpu' else 'cuda'
    forward_in(precision, model, device_type)  # a bad precision, now

    def run(net, x):
        set_mode(net, step_mode)
        try:
            step = make_step(forward_in(precision, net, device_type),
                             step_mode)
            step(x)
            net.zero_grad(set_to_none=True)
            return count_call(step, x)
        finally:
            net.zero_grad(set_to_none=True)
            set_mode(net, 'fwd')

    if place != 'fake-cuda':
        return run(model, make_input((h, w), batch, torch.device(place),
                                     seed))
    from torch._subclasses.fake_tensor import (DataDependentOutputException,
                                               DynamicOutputShapeException,
                                               FakeTensorMode)
    twin = copy.deepcopy(model)  # fake tensors end up in its caches
    try:
        with warnings.catch_warnings(), \
                FakeTensorMode(allow_non_fake_inputs=True):
            # (caches keyed on data_ptr warn that fake tensors have none)
            warnings.simplefilter('ignore')
            twin.to('cuda')
            return run(twin, torch.empty(batch, 3, h, w, device='cuda'))
    except (DataDependentOutputException, DynamicOutputShapeException) as e:
        # a host sync: fake tensors have no value to give the host
        raise NeedsData(f'{type(model).__name__} reads device data on the '
                        f'host ({e})') from None


class NeedsData(RuntimeError):
    """A step on fake tensors reached a host sync: fake tensors have no
    value to give the host."""


def counted_row(model: nn.Module, name: str, mode: str,
                shape: Sequence[int], place: str, precision: str,
                spec: GpuSpec, seed: int, log: Callable[[str], None]) -> dict:
    """One model's counts of one step, where they were counted (real CPU
    tensors where fake ones need data) and the estimate on ``spec``."""
    where = place
    try:
        counts = count_step(model, mode, shape, where, seed, precision)
    except NeedsData as e:
        log(f'{step_name(mode, shape)} {name} {precision}: {e}; counting '
            f'it on real CPU tensors')
        where = 'cpu'
        counts = count_step(model, mode, shape, where, seed, precision)
    row = dict(counted_on=where, **counts)
    row.update(estimate(row['ops'], row['bytes_written'], row['flops'],
                        spec, row['flops_by_dtype'].get('bfloat16', 0)))
    log(f'{step_name(mode, shape):<22s} {name:<10s} {precision} '
        f'{row["ops"]:6d} ops  {row["bytes_written"] / 1e9:7.3f} GB  '
        f'{row["syncs"]} syncs  estimate {row["estimate_s"] * 1e3:7.2f} ms '
        f'({row["bound"]}-bound; counted on {where})')
    return row


def run_gpu_proxy(models: Dict[str, nn.Module],
                  steps: Sequence[Tuple[str, Sequence[int]]],
                  device: torch.device, spec: GpuSpec = H200, seed: int = 0,
                  bf16: bool = True, log: Callable[[str], None] = print
                  ) -> dict:
    """A row per (step, model): the fp32 counts and the estimate on
    ``spec``, and with ``bf16`` the same under bfloat16 autocast in the
    row's 'bf16' entry. ``models`` are on ``device``."""
    rows = []
    for mode, shape in steps:
        place = counting_place(mode, device)
        for name, model in models.items():
            row = dict(model=name, mode=mode, shape=list(shape),
                       **counted_row(model, name, mode, shape, place, 'fp32',
                                     spec, seed, log))
            if bf16:
                row['bf16'] = counted_row(model, name, mode, shape, place,
                                          'bf16', spec, seed, log)
            rows.append(row)
    return dict(gpu=dataclasses.asdict(spec), path='cuda', rows=rows)
