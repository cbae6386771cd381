"""Device-independent GPU figures of a step: how many operations launch
work, how many bytes they write, how many force the host to wait for the
device, and how many FLOPs they do; and from these an estimated time on a
named GPU.

On a GPU in eager mode every operation that does work is at least one
kernel launch, paid for on the host whatever the kernel's size, so a model
of many small operations is slow there even when a CPU, where each
operation costs about its arithmetic, runs it fast. These counts say so on
any machine, the CPU of a developer's laptop included: they depend only on
the operations the model's forward (and backward) calls, seen at the level
of ATen (the operators a device's kernels implement) by a
``TorchDispatchMode``, on the code path the model takes on a CUDA device
(``counting_place``: a model may run differently on a CPU).

What counts as an operation:

- counted: every ATen operation that computes or fills memory, in-place
  and ``out=`` variants included (``zeros``, ``fill_``, ``copy_``,
  ``clone`` count: each writes memory);
- not counted (they launch no kernel): views and other metadata-only
  operations (every operator whose schema returns an alias of an input,
  such as ``view``, ``reshape`` as a view, ``permute``, ``transpose``,
  ``t``, ``expand``, ``as_strided``, ``slice``, ``select``, ``unsqueeze``,
  ``squeeze``, ``split``/``chunk``, ``detach``, ``alias``; the in-place
  view operators such as ``squeeze_``; ``_unsafe_view``), allocations
  without a fill (``empty`` and its variants, ``resize_``), and operators
  that return no tensor and read no data (size and stride queries).

Bytes written: the sizes of the counted operations' tensor outputs (the
mutated tensor of an in-place or ``out=`` operation included).

Host syncs: operations that make the host read a value the device
computed, so that the host waits for the device and the launch queue
drains: ``_local_scalar_dense`` (``.item()``, ``bool(t)``, ``int(t)``),
``is_nonzero``, ``equal``, ``allclose``, and operations whose output size
depends on the data (``nonzero``, ``masked_select``, ``unique``,
``repeat_interleave`` without ``output_size``, indexing with a boolean
mask), and copies from a device to the host (seen only when counting on
that device). A sync is also counted as an operation.

Precision: each step is counted twice, in fp32 and under
``torch.autocast`` with bfloat16 (``PRECISIONS``; the forward inside
autocast, the loss and the backward outside it, as mixed-precision
training runs). Autocast's policy depends on the device type: on CUDA it
keeps ``layer_norm``, ``softmax``, ``sum``, ``exp``, ``pow``, ``rsqrt``
and other reductions and transcendental functions in fp32 (their outputs
fp32, so the next matmul casts them back), on the CPU it lowers the same
matmuls and convolutions but keeps none of these in fp32. The counts
follow the policy of the device type where a step is counted
(``counting_place``): CUDA's for steps on real or fake CUDA tensors
(``autocast_enabled`` switches CUDA autocast on without a GPU, which
``torch.autocast`` refuses to do), the CPU's for steps counted on CPU
tensors.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import warnings
from typing import Callable, Dict, Optional, Sequence, Tuple

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

from .measure import log, make_input, make_step, set_mode

aten = torch.ops.aten

# Allocations without a fill, and operators that change only a tensor's
# metadata without being declared views: no kernel runs.
METADATA_ONLY = frozenset({
    aten.empty, aten.empty_like, aten.empty_strided, aten.empty_permuted,
    aten.new_empty, aten.new_empty_strided, aten.resize_, aten.set_,
    aten._unsafe_view, aten.lift_fresh,
})
# Operators that make the host read device data (see the module's text).
HOST_READS = frozenset({
    aten._local_scalar_dense, aten.is_nonzero, aten.equal, aten.allclose,
    aten.nonzero, aten.masked_select, aten.unique_consecutive,
    aten.unique_dim, aten._unique, aten._unique2, aten.unique_dim_consecutive,
})
# Indexing operators that turn a boolean mask into indices (nonzero inside).
MASK_INDEXING = frozenset({aten.index, aten.index_put, aten.index_put_,
                           aten._index_put_impl_})

# The benchmark's steps: (mode, (batch, height, width)); 'inference' is a
# forward in eval mode without autograd, 'train' a forward and backward in
# train mode (``measure.make_step``). The 448x672 steps are sizes at which
# every level of PosMLP-T and Swin-T tiles by whole windows: no padding in
# either, so their ratios are the architectures' own, without the window
# layout's share.
STEPS = (('inference', (1, 800, 1333)), ('inference', (2, 512, 512)),
         ('train', (2, 512, 512)), ('train', (2, 800, 1333)),
         ('inference', (1, 448, 672)), ('train', (2, 448, 672)))
STEP_MODES = {'inference': 'fwd', 'train': 'fwdbwd'}
MODELS = ('posmlp_t', 'swin_t', 'resnet50')
# The arithmetic a step is counted in: fp32 throughout, or the forward
# under autocast with bfloat16 (see the module's text).
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
    """Counts the ATen operations run inside it: ``ops`` (those that launch
    work), ``bytes_written`` (and per dtype, ``bytes_by_dtype``),
    ``syncs``, the counts per operator (``by_op``; ``syncs_by_op``), and
    the FLOPs of the operators ``FlopCounterMode`` counts, by the dtype
    they compute in (``flops_by_dtype``: that of their first tensor
    argument). See the module's text for what counts."""

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
    """Estimated seconds of one step on ``spec``'s GPU.

    launch = ops x launch_s: the host issues the operations one by one;
    memory = bytes written / bandwidth; compute = the ``bf16_flops`` of
    the ``flops`` at peak_bf16_flops, the rest at peak_flops.
    The device works through memory-bound and compute-bound kernels one
    after another, so its time is memory + compute; the host launches
    ahead of the device asynchronously, so the step takes the longer of
    the two: estimate = max(launch, memory + compute). ``bound`` names
    which side that is. (Reads are not counted, so memory is a lower
    bound of the traffic's time.)"""
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
    """Counts of one call ``step(x)``: OpCounter's and
    ``FlopCounterMode``'s (matmuls and convolutions, forward and
    backward)."""
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
    """Autocast to ``dtype`` for tensors of ``device_type``, switched on
    through torch's autocast state as ``torch.autocast`` does on entry,
    but also for 'cuda' on a machine without a GPU (fake CUDA tensors),
    where ``torch.autocast('cuda')`` warns and stays off."""
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


# Where a step is counted (``count_step``): real tensors on the CPU or on a
# CUDA device, or fake CUDA tensors (torch's FakeTensorMode: shapes and
# devices without data or arithmetic), which need no GPU.
PLACES = ('cpu', 'cuda', 'fake-cuda')
# Which code path of the models the counts follow (``counting_place``).
PATHS = ('cuda', 'cpu')


def counting_place(mode: str, path: str, device: torch.device) -> str:
    """Where to count a step of ``mode`` so that the counts follow the
    models' ``path`` ('cuda' or 'cpu'), on a run whose device is
    ``device``.

    A model may run differently on a GPU (PosMLP-T's stem trains in NCHW
    on a CPU, channels-last elsewhere: one copy). Path 'cuda': real CUDA
    tensors when the run has a GPU; without one, fake CUDA tensors for
    inference, and real CPU tensors for training, as autograd's engine
    needs a GPU for a backward on CUDA tensors, fake or not."""
    if path not in PATHS:
        raise ValueError(f'unknown path {path!r}; choose from {PATHS}')
    if path == 'cpu':
        return 'cpu'
    if device.type == 'cuda':
        return 'cuda'
    return 'fake-cuda' if mode == 'inference' else 'cpu'


def count_step(model: nn.Module, mode: str, shape: Sequence[int],
               place: str = 'cpu', seed: int = 0,
               precision: str = 'fp32') -> dict:
    """Counts (``count_call``) of one step of ``model``: ``mode``
    'inference' or 'train', input ``shape`` = (batch, height, width), 3
    channels, counted at ``place`` (``PLACES``): real tensors on 'cpu' or
    'cuda' (the model must be there), or 'fake-cuda', a copy of the model
    on fake CUDA tensors (inference only); in ``precision`` (``PRECISIONS``;
    bf16: the forward under the autocast policy of the place's device
    type). A step before the counted one fills the model's caches, and the
    gradients are dropped between them, so the count is that of a step in
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
    """A step on fake tensors reached an operation whose result depends on
    the tensors' data (a host sync); ``run_gpu_proxy`` then counts that
    step on real CPU tensors."""


def step_name(mode: str, shape: Sequence[int]) -> str:
    return f"{mode} {'x'.join(map(str, [shape[0], 3, *shape[1:]]))}"


def counted_row(model: nn.Module, name: str, mode: str,
                shape: Sequence[int], place: str, precision: str,
                spec: GpuSpec, seed: int, start: Optional[float]) -> dict:
    """One model's counts of one step in ``precision`` at ``place``
    (falling back to real CPU tensors where fake ones need data), where
    they were counted, and the estimate on ``spec``."""
    where = place
    try:
        counts = count_step(model, mode, shape, where, seed, precision)
    except NeedsData as e:
        log(f'gpu proxy {step_name(mode, shape)} {name} {precision}: {e}; '
            f'counting it on real CPU tensors', start)
        where = 'cpu'
        counts = count_step(model, mode, shape, where, seed, precision)
    row = dict(counted_on=where, **counts)
    row.update(estimate(row['ops'], row['bytes_written'], row['flops'],
                        spec, row['flops_by_dtype'].get('bfloat16', 0)))
    log(f'gpu proxy {step_name(mode, shape):<22s} {name:<10s} {precision} '
        f'{row["ops"]:6d} ops  {row["bytes_written"] / 1e9:7.3f} GB '
        f'written  {row["syncs"]} syncs  {row["flops"] / 1e9:8.1f} GFLOP  '
        f'estimate {row["estimate_s"] * 1e3:7.2f} ms on {spec.name} '
        f'({row["bound"]}-bound; counted on {where})', start)
    return row


def run_gpu_proxy(models: Dict[str, nn.Module],
                  steps: Sequence[Tuple[str, Sequence[int]]],
                  device: torch.device, path: str = 'cuda',
                  spec: GpuSpec = H200, seed: int = 0,
                  start: Optional[float] = None, bf16: bool = True) -> dict:
    """A row per (step, model): the fp32 counts, where they were counted
    (``counting_place``) and the estimate on ``spec``, and with ``bf16``
    the same under bfloat16 autocast in the row's 'bf16' entry; with the
    spec itself, for the report. ``models`` are on ``device``, or on the
    CPU when the run has no GPU or ``path`` is 'cpu'."""
    rows = []
    for mode, shape in steps:
        place = counting_place(mode, path, device)
        for name, model in models.items():
            row = dict(model=name, mode=mode, shape=list(shape), path=path,
                       **counted_row(model, name, mode, shape, place, 'fp32',
                                     spec, seed, start))
            if bf16:
                row['bf16'] = counted_row(model, name, mode, shape, place,
                                          'bf16', spec, seed, start)
            rows.append(row)
    return dict(gpu=dataclasses.asdict(spec), path=path, rows=rows)
