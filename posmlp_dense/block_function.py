"""The PoSGU block's training pass as one autograd Function.

    y = x + s * (PoSGU(GELU(LN(x) W_e^T + b_e)) W_s^T + b_s)

with PoSGU(a) = (P u + bias) * v for the halves u, v of a, mixed window by
window (token_mixing.py), and s the stochastic-depth scale (or 1).

Autograd through these operations one by one keeps, per token of a block
with C channels and K gate channels, LN's input and output, the
pre-activation h and the activation a (GELU saves its input; u and v are
halves of its output), the mixing input (u re-laid out), the mixed values
and the gated product: 2C + 7K values, 16C at the published mlp_ratio of 4.
Per block it also keeps the mixing matrices and the gate's intermediates
(for GQPE a softmax and its scores: several groups x n x n tensors per
window class), and the projections' weights gathered into the gate's
channel order.

This Function keeps x, LN's mean and rstd, h (2K) and the mixed values
(K): C + 3K per token, 7C at mlp_ratio 4, and nothing per block. Its
backward recomputes the rest from those with elementwise passes (LN's
output, GELU(h), the gated product) and the mixing matrices from the gate's
parameters (small next to the token matmuls); no matmul over tokens runs
twice.

Between the two projections the hidden values are channel-major, window
class by window class (``_run_blocks``): the expansion writes h^T, whose
rows for one gate group and one class are already the (V * windows, n)
matrix that the mixing multiplies by P^T. The token mixing then needs no
re-arrangement of u (autograd through each operation re-lays it out, and
its gradient back, in every block), and the gating multiplies contiguous
values.

Under autocast it computes what autograd through the same operations would:
LayerNorm in the parameters' dtype, matmuls and GELU in the autocast dtype,
the mixing matrices in float32 cast to it, the residual sum in the promoted
dtype.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Optional, Sequence

import torch
from torch.autograd.function import once_differentiable

from .token_mixing import _matching_dtype, group_rows, mix_rows
from .gates.posgu import from_group_major, to_group_major
from .windows import WindowRun
from .workspace import TrainingScratch, Workspace


def lean_block_forward(block, x: torch.Tensor, runs: Sequence[WindowRun],
                       scale: Optional[torch.Tensor] = None,
                       scratch: Optional[TrainingScratch] = None,
                       last_backward: bool = False) -> torch.Tensor:
    """``block`` (a PosMLPBlock with a PoSGU gate and GELU) on a (T, C)
    token buffer laid out as ``runs``; ``scale``: the (T, 1)
    stochastic-depth scale or None; ``scratch``: the level's shared
    temporaries (None: fresh ones), released after this block's backward
    if ``last_backward``."""
    gate = block.gate_unit
    keys = []
    for run in runs:
        if run.key not in keys:
            keys.append(run.key)
    layout = _Layout(tuple(runs), tuple(keys), gate, block.norm.eps,
                     block.act.approximate, scratch, last_backward)
    norm, expand, shrink = block.norm, block.proj_c_e, block.proj_c_s
    return LeanPoSGUBlock.apply(
        x, norm.weight, norm.bias, expand.weight, expand.bias, shrink.weight,
        shrink.bias, scale, layout, *layout.gate_params)


class _Layout:
    """What the Function needs besides tensors (kept off autograd)."""

    def __init__(self, runs, keys, gate, eps, approximate, scratch=None,
                 last_backward=False):
        self.scratch = scratch
        self.last_backward = last_backward
        self.runs = runs
        self.keys = keys
        self.matrix_of_run = tuple(keys.index(r.key) for r in runs)
        self.gate = gate
        named = list(gate.named_parameters())
        self.gate_param_names = tuple(n for n, _ in named)
        self.gate_params = tuple(p for _, p in named)
        self.groups = gate.groups
        self.eps = eps
        self.approximate = approximate

    def forward_buffers(self) -> Workspace:
        return self.scratch.forward if self.scratch is not None \
            else Workspace()

    def backward_buffers(self) -> Workspace:
        return self.scratch.backward if self.scratch is not None \
            else Workspace()

    def matrices(self, workspace=None):
        """The gate's augmented (groups, n, n + 1) matrix per window class;
        ``workspace``: for the gate's temporaries."""
        with self.gate.sharing_parameter_terms():
            return [self.gate.augmented_mixing(key, fresh=True,
                                               workspace=workspace)
                    for key in self.keys]

    @contextmanager
    def gate_leaves(self, params, needs):
        """The gate parameters the forward saw, detached into leaves
        (requiring grad where ``needs``) and swapped into the gate, with
        grad enabled: the backward's small autograd graphs from them. The
        gate's own parameters may have been replaced since the forward
        (e.g. torch.func.functional_call, which restores them on return)."""
        leaves = [p.detach().requires_grad_(need)
                  for p, need in zip(params, needs)]
        with torch.enable_grad(), _backward_graph(), _swapped_parameters(
                self.gate, self.gate_param_names, leaves):
            yield leaves

    def recompute_matrices(self, params):
        """The matrices, recomputed with autograd from the parameters the
        forward saw; returns them and those parameters' leaves."""
        with self.gate_leaves(params,
                              [p.requires_grad for p in params]) as leaves:
            return self.matrices(), leaves

    def gate_order(self, w_e, b_e, w_s):
        """The projections with the gate's channels in its order."""
        if not self.gate.group_major:
            return w_e, b_e, w_s
        return to_group_major(w_e, b_e, w_s, self.groups)

    def published_order(self, d_w_e, d_b_e, d_w_s):
        """Gradients in the gate's channel order -> the parameters' order."""
        if not self.gate.group_major:
            return d_w_e, d_b_e, d_w_s
        return from_group_major(d_w_e, d_b_e, d_w_s, self.groups)

    def analytic_gate_gradients(self, params, needs, matrices, d_matrices):
        """The gate parameters' gradients through its ``mixing_backward``,
        with the parameters the forward saw swapped into the gate."""
        if not any(needs) or all(d is None for d in d_matrices):
            return [None] * len(params)
        d_matrices = [d.to(m.dtype) for m, d in zip(matrices, d_matrices)]
        with _swapped_parameters(self.gate, self.gate_param_names,
                                 [p.detach() for p in params]):
            grads = self.gate.mixing_backward(self.keys, matrices,
                                              d_matrices)
        result = []
        for name, param, need in zip(self.gate_param_names, params, needs):
            grad = grads.get(name) if need else None
            if need and grad is None:
                grad = torch.zeros_like(param)
            result.append(grad)
        return result


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    device = x.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return x.dtype


class LeanPoSGUBlock(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x, norm_weight, norm_bias, w_e, b_e, w_s, b_s, scale,
                layout, *gate_params):
        cdtype = _compute_dtype(x)
        buffers = layout.forward_buffers()
        runs = layout.runs
        with torch.autocast(x.device.type, enabled=False):
            T, C = x.shape
            ln_input = x.to(norm_weight.dtype)
            normed = buffers.get('normed', (T, C), ln_input)
            mean, rstd = ln_input.new_empty(T, 1), ln_input.new_empty(T, 1)
            torch.ops.aten.native_layer_norm.out(
                ln_input, [C], norm_weight, norm_bias, layout.eps,
                out0=normed, out1=mean, out2=rstd)
            expand_w, expand_b, shrink_w = (
                t.to(cdtype) for t in layout.gate_order(w_e, b_e, w_s))
            normed = normed.to(cdtype)
            hidden = expand_w.shape[0]
            # h^T, run by run: (hidden, rows) blocks (see _run_blocks)
            h = normed.new_empty(hidden * T)
            for rows, h_r in zip(_token_rows(normed, runs),
                                 _run_blocks(h, runs)):
                torch.addmm(expand_b.view(-1, 1), expand_w, rows.t(),
                            out=h_r)
            del normed
            a = torch.ops.aten.gelu.out(
                h, approximate=layout.approximate,
                out=buffers.get('activation', h.shape, h))
            matrices = layout.matrices(buffers)
            # the gated product is written over each run's u
            mixed = _mix(a, layout, matrices)
            out = torch.empty((T, shrink_w.shape[0]), dtype=cdtype,
                              device=x.device)
            shrink_b = b_s.to(cdtype)
            for out_r, a_r in zip(_token_rows(out, runs),
                                  _run_blocks(a, runs)):
                torch.addmm(shrink_b, a_r[:hidden // 2].t(), shrink_w.t(),
                            out=out_r)
            del a, expand_w, expand_b, shrink_w
            if scale is not None:
                out.mul_(scale.to(cdtype))
            if out.dtype == x.dtype:
                y = out.add_(x)
            else:  # autocast: the sum in the promoted dtype
                y = x + out
        ctx.layout = layout
        ctx.cdtype = cdtype
        ctx.x_dtype = x.dtype
        ctx.num_gate = len(gate_params)
        # a gate with an analytic backward needs its matrices (a few per
        # block, independent of the batch); the others are recomputed
        if not layout.gate.has_mixing_backward:
            matrices = []
        ctx.num_matrices = len(matrices)
        ctx.save_for_backward(x, norm_weight, norm_bias, w_e, b_e, w_s, scale,
                              mean, rstd, h, *gate_params, *matrices, *mixed)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        layout, cdtype = ctx.layout, ctx.cdtype
        runs = layout.runs
        (x, norm_weight, norm_bias, w_e, b_e, w_s, scale, mean, rstd,
         h, *rest) = ctx.saved_tensors
        gate_params = rest[:ctx.num_gate]
        matrices = rest[ctx.num_gate:ctx.num_gate + ctx.num_matrices]
        mixed = rest[ctx.num_gate + ctx.num_matrices:]
        needs = ctx.needs_input_grad
        needs_gate = needs[9:]
        if not matrices:
            # recomputed with autograd, for the gate parameters' gradients
            matrices, gate_leaves = layout.recompute_matrices(gate_params)
        with torch.autocast(dy.device.type, enabled=False):
            expand_w, _, shrink_w = (
                t.to(cdtype) for t in layout.gate_order(w_e, b_e, w_s))
            hidden = expand_w.shape[0]
            dout = dy.to(cdtype)
            if scale is not None:
                dout = dout * scale.to(cdtype)
            buffers = layout.backward_buffers()
            # the activation and the gated product, recomputed
            a = torch.ops.aten.gelu.out(
                h, approximate=layout.approximate,
                out=buffers.get('activation', h.shape, h))
            gated = buffers.get('gated', (h.numel() // 2,), h)
            d_gated = buffers.get('d_gated', gated.shape, dout)
            d_w_s = None
            for (u, v), g_r, dg_r, m, dout_r in zip(
                    _gate_halves(a, layout), _run_blocks(gated, runs),
                    _run_blocks(d_gated, runs), mixed,
                    _token_rows(dout, runs)):
                torch.mul(m, v, out=g_r.view(m.shape))
                if needs[5]:
                    d_w_s = dout_r.t().mm(g_r.t()) if d_w_s is None \
                        else d_w_s.addmm_(dout_r.t(), g_r.t())
                torch.mm(shrink_w.t(), dout_r.t(), out=dg_r)
            d_b_s = dout.sum(0) if needs[6] else None
            del dout, gated
            # d(u, v) is written over a
            d_matrices = _mix_backward(
                a, d_gated, layout, [m.detach() for m in matrices], mixed,
                any(needs_gate), buffers)
            del d_gated
            # GELU's backward, written over its incoming gradient
            d_h = torch.ops.aten.gelu_backward.grad_input(
                a, h, approximate=layout.approximate, grad_input=a)
            del a
            ln_input = x.to(norm_weight.dtype)
            normed = torch.sub(ln_input, mean, out=buffers.get(
                'normed', ln_input.shape, ln_input))
            normed.mul_(rstd).mul_(norm_weight).add_(norm_bias)
            normed = normed.to(cdtype)
            d_normed = buffers.get('d_normed', (x.shape[0],
                                                expand_w.shape[1]), d_h)
            d_w_e = d_b_e = None
            for d_h_r, rows, d_rows in zip(_run_blocks(d_h, runs),
                                           _token_rows(normed, runs),
                                           _token_rows(d_normed, runs)):
                if needs[3]:
                    d_w_e = d_h_r.mm(rows) if d_w_e is None \
                        else d_w_e.addmm_(d_h_r, rows)
                if needs[4]:
                    d_b_e = d_h_r.sum(1) if d_b_e is None \
                        else d_b_e.add_(d_h_r.sum(1))
                torch.mm(d_h_r.t(), expand_w, out=d_rows)
            del normed, d_h
            d_x, d_norm_w, d_norm_b = \
                torch.ops.aten.native_layer_norm_backward(
                    d_normed.to(norm_weight.dtype), ln_input, (x.shape[1],),
                    mean, rstd, norm_weight, norm_bias,
                    [needs[0], needs[1], needs[2]])
            if needs[0]:
                d_x = d_x.add_(dy) if d_x.dtype == dy.dtype else \
                    dy + d_x.to(ctx.x_dtype)
            d_w_e, d_b_e, d_w_s = layout.published_order(d_w_e, d_b_e, d_w_s)
        if layout.last_backward and layout.scratch is not None:
            layout.scratch.release()
        if ctx.num_matrices:
            d_gate = layout.analytic_gate_gradients(gate_params, needs_gate,
                                                    matrices, d_matrices)
        else:
            d_gate = _gate_gradients(gate_leaves, needs_gate, matrices,
                                     d_matrices)
        return (d_x, d_norm_w, d_norm_b, d_w_e, d_b_e, d_w_s, d_b_s, None,
                None, *d_gate)


def _token_rows(tokens, runs):
    """Each run's rows of a (T, C) token buffer."""
    return tokens.split([run.rows for run in runs])


def _run_blocks(flat, runs):
    """Each run's (channels, rows) block of a flat channel-major buffer.

    Inside the Function the hidden activations are stored transposed, run by
    run: the run's ``channels x rows`` values, channel after channel. A
    gate group's channels then hold, for each channel, the run's windows one
    after another: a (V * windows, n) matrix whose rows are windows of one
    channel, which the mixing multiplies by P^T with no re-arrangement."""
    channels = flat.numel() // sum(run.rows for run in runs)
    blocks, start = [], 0
    for run in runs:
        size = channels * run.rows
        blocks.append(flat[start:start + size].view(channels, run.rows))
        start += size
    return blocks


def _gate_halves(a, layout):
    """Per run, the halves u, v of the activation ``a`` (channel-major, see
    _run_blocks) as (groups, V * windows, n) matrices."""
    for run, a_r in zip(layout.runs, _run_blocks(a, layout.runs)):
        u, v = a_r.chunk(2)
        yield (group_rows(u, layout.groups, run),
               group_rows(v, layout.groups, run))


def _mix(a, layout, matrices):
    """The gated product (P u + bias) * v of the halves u, v of ``a``, run
    by run, written over u. Returns each run's mixed values P u + bias
    (groups, V * windows, n), the only intermediate the backward keeps."""
    mixed = []
    for (u, v), index in zip(_gate_halves(a, layout), layout.matrix_of_run):
        m = mix_rows(u, matrices[index])
        # u is consumed: the product goes where it was
        torch.mul(m, v, out=u)
        mixed.append(m)
    return mixed


def _mix_backward(a, d_gated, layout, matrices, mixed, needs_matrices,
                  buffers):
    """Gradients of the gated mixing, run by run. ``d_gated`` is the
    gradient of the gated product (channel-major like ``a``). d(u, v) is
    written over ``a`` (each run's u and v are read before they are
    overwritten). Returns d(augmented matrix) per window class when
    ``needs_matrices``."""
    d_matrices = [None] * len(matrices)
    for (u, v), dg, m, run, index in zip(
            _gate_halves(a, layout), _run_blocks(d_gated, layout.runs),
            mixed, layout.runs, layout.matrix_of_run):
        n = run.n
        dg = group_rows(dg, layout.groups, run)
        d_m = torch.mul(dg, v, out=buffers.get('d_mixed', m.shape, m))
        # v is consumed: d(v) goes where it was
        torch.mul(dg, m, out=v)
        if needs_matrices:
            # d(P) = d_m^T u per group; the bias column's gradient is each
            # query's d_m summed over the rows (the bias meets ones). A
            # window class's first run writes into the level's buffer.
            previous = d_matrices[index]
            d_matrix = buffers.get(('d_matrix', index),
                                   (d_m.shape[0], n, n + 1), d_m) \
                if previous is None else torch.empty_like(previous)
            torch.bmm(d_m.transpose(1, 2), u, out=d_matrix[..., :n])
            torch.sum(d_m, dim=1, out=d_matrix[..., n])
            d_matrices[index] = d_matrix if previous is None \
                else previous.add_(d_matrix)
        # u is no longer read: d(u) = d_m P goes where it was
        torch.bmm(d_m, _matching_dtype(matrices[index], d_m)[..., :n],
                  out=u)
    return d_matrices


def _gate_gradients(params, needs, matrices, d_matrices):
    """Backpropagate the matrices' gradients into the gate's parameters."""
    wanted = [p for p, need in zip(params, needs) if need]
    if not wanted:
        return [None] * len(params)
    pairs = [(m, d.to(m.dtype)) for m, d in zip(matrices, d_matrices)
             if d is not None and m.requires_grad]
    if not pairs:
        return [None] * len(params)
    grads = iter(torch.autograd.grad(
        [m for m, _ in pairs], wanted, [d for _, d in pairs],
        allow_unused=True))
    return [next(grads) if need else None for need in needs]


def _backward_graph():
    """For the small autograd graphs the backward builds (the gate's
    parameters -> its matrices): what they save is transient and local to
    the backward, not an activation of the forward, so the caller's
    saved-tensor hooks (offloading, or the benchmark's count of saved
    activations) are not applied to it."""
    return torch.autograd.graph.saved_tensors_hooks(_identity, _identity)


def _identity(t):
    return t


@contextmanager
def _swapped_parameters(module, names, tensors):
    """Temporarily make ``tensors`` the parameters ``names`` of ``module``."""
    slots = []
    for name, tensor in zip(names, tensors):
        owner_path, _, attr = name.rpartition('.')
        owner = module.get_submodule(owner_path) if owner_path else module
        slots.append((owner, attr, owner._parameters[attr]))
        owner._parameters[attr] = tensor
    try:
        yield
    finally:
        for owner, attr, original in slots:
            owner._parameters[attr] = original
