"""benchmarks.inductor_counts: the kernels and bytes inductor reports for a
compiled step, read from its metrics log (no timing)."""
from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from benchmarks.inductor_counts import _METRICS_LOGGER, count_compiled_step
from benchmarks.tables import inductor_counts_section


class _Chain(nn.Module):
    """A matmul-like projection (1x1 conv) then a chain of elementwise
    operations that inductor fuses into few kernels."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Conv2d(3, 8, 1)

    def forward(self, x):
        y = self.proj(x)
        y = ((y * 2 + 1).relu() * 3 - y).sigmoid()
        return (y,)


def test_counts_fused_kernels_and_bytes_per_graph():
    model = _Chain()
    level = logging.getLogger(_METRICS_LOGGER).level
    inference = count_compiled_step(model, 'inference', (1, 8, 8))
    assert len(inference['graphs']) == 1
    # the projection is an extern call; the six elementwise operations
    # fuse into far fewer kernels than eager's one per operation
    assert inference['extern_kernels'] >= 1
    assert inference['kernels'] <= 4
    # at least the input and the output are moved
    assert inference['bytes_accessed'] >= (3 + 8) * 8 * 8 * 4
    train = count_compiled_step(model, 'train', (2, 8, 8))
    assert len(train['graphs']) == 2      # forward and backward
    assert train['bytes_accessed'] > inference['bytes_accessed']
    # the logger is left as it was, and the model as eval with no grads
    assert logging.getLogger(_METRICS_LOGGER).level == level
    assert all(p.grad is None for p in model.parameters())
    with pytest.raises(ValueError, match='unknown mode'):
        count_compiled_step(model, 'backward', (1, 8, 8))


class _SliceOfStack(nn.Module):
    """A matmul that reads one (8, 8) slice of a (64, 8, 8) stack its
    graph computes: inductor charges the extern call the whole stack."""

    def __init__(self):
        super().__init__()
        self.stack = nn.Parameter(torch.randn(64, 8, 8))

    def forward(self, x):
        stack = self.stack * 2
        y = x @ stack[5]
        return (y,)


def test_extern_operands_by_extent():
    model = _SliceOfStack()
    counts = count_compiled_step(model, 'inference', (1, 8, 8))
    graph = counts['graphs'][0]
    assert graph['bytes_by_extent'] == counts['bytes_by_extent']
    stack_bytes = 64 * 8 * 8 * 4
    # inductor's figure holds the stack twice (written, and read whole
    # by the matmul); by extent the matmul reads its 8 x 8 slice
    assert counts['bytes_accessed'] >= 2 * stack_bytes
    saved = counts['bytes_accessed'] - counts['bytes_by_extent']
    assert stack_bytes - 8 * 8 * 4 - 64 <= saved <= stack_bytes
    # with no slicing, the two figures agree
    plain = count_compiled_step(_Chain(), 'inference', (1, 8, 8))
    assert plain['bytes_by_extent'] == plain['bytes_accessed']


class _CatOfTwo(nn.Module):
    """A cat of two computed halves: on a CPU inductor writes each half
    into its slice of the output, and the cat itself is a no-op node."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Conv2d(3, 8, 1)

    def forward(self, x):
        y = self.proj(x)
        return (torch.cat([y.relu(), y.sigmoid()], 1).sum(1),)


def test_no_op_nodes_are_not_kernels():
    counts = count_compiled_step(_CatOfTwo(), 'inference', (1, 8, 8))
    assert counts['no_op_nodes'] == counts['graphs'][0]['no_op_nodes'] == 1
    # the convolution, the two halves and the sum; not the cat
    assert counts['kernels'] == 4


def test_freezing_computes_what_the_parameters_alone_decide_once():
    # the stack depends on a parameter alone: frozen, it is a constant
    # and its kernel is gone
    model = _SliceOfStack()
    plain = count_compiled_step(model, 'inference', (1, 8, 8))
    frozen = count_compiled_step(model, 'inference', (1, 8, 8),
                                 freezing=True)
    assert frozen['kernels'] < plain['kernels']
    assert not torch._inductor.config.freezing
    with pytest.raises(ValueError, match='inference only'):
        count_compiled_step(model, 'train', (2, 8, 8), freezing=True)


def test_markdown_sets_the_models_side_by_side():
    rows = [dict(model=m, mode='inference', shape=[1, 64, 64],
                 eager=dict(ops=ops, bytes_written=2e9), kernels=k,
                 extern_kernels=1, bytes_accessed=b, graphs=[{}])
            for m, ops, k, b in (('posmlp_t', 300, 90, 3e9),
                                 ('swin_t', 400, 120, 2e9))]
    text = inductor_counts_section(
        dict(inductor_counts=dict(device='cpu', torch='x', rows=rows)))
    assert ('| inference 1x3x64x64 | PosMLP-T | 300 | 2.000 | 90 (1) | '
            '3.000 | - |') in text
    assert '| inference 1x3x64x64 | 0.75 | 1.00 | 0.75 | 1.50 | - |' in text
    for r, b in zip(rows, (2.4e9, 2e9)):
        r['bytes_by_extent'] = b
    text = inductor_counts_section(
        dict(inductor_counts=dict(device='cpu', torch='x', rows=rows)))
    assert ('| inference 1x3x64x64 | PosMLP-T | 300 | 2.000 | 90 (1) | '
            '3.000 | 2.400 |') in text
    assert '| inference 1x3x64x64 | 0.75 | 1.00 | 0.75 | 1.50 | 1.20 |' \
        in text
    # frozen rows are steps of their own, set side by side among themselves
    frozen = [dict(r, freezing=True, kernels=r['kernels'] // 2)
              for r in rows]
    text = inductor_counts_section(dict(inductor_counts=dict(
        device='cpu', torch='x', rows=rows + frozen)))
    assert ('| inference 1x3x64x64, frozen | PosMLP-T | 300 | 2.000 | '
            '45 (1) |') in text
    assert ('| inference 1x3x64x64, frozen | 0.75 | 1.00 | 0.75 | 1.50 | '
            '1.20 |') in text
    assert inductor_counts_section({}) == ''
