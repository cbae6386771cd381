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
backward recomputes the rest from those with elementwise passes and copies
(LN's output, GELU(h), the mixing input, the gated product) and the mixing
matrices from the gate's parameters (small next to the token matmuls); no
matmul over tokens runs twice.

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

from .token_mixing import (_matching_dtype, _mixing_input, _run_views,
                           _token_order)
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

    def matrices(self):
        """The gate's augmented (groups, n, n + 1) matrix per window class."""
        return [self.gate.augmented_mixing(key, fresh=True)
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
        """The gate parameters' gradients through its ``mixing_backward``."""
        wanted = [i for i, need in enumerate(needs) if need]
        if not wanted or all(d is None for d in d_matrices):
            return [None] * len(params)
        d_matrices = [d.to(m.dtype) for m, d in zip(matrices, d_matrices)]
        with self.gate_leaves(params, needs) as leaves:
            outputs, grads = self.gate.mixing_backward(
                self.keys, matrices, d_matrices)
            found = torch.autograd.grad(
                outputs, [leaves[i] for i in wanted], grads,
                allow_unused=True)
        result = [None] * len(params)
        for i, grad in zip(wanted, found):
            result[i] = grad if grad is not None else torch.zeros_like(
                params[i])
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
            h = torch.addmm(expand_b, normed.to(cdtype), expand_w.t())
            del normed
            a = torch.ops.aten.gelu.out(
                h, approximate=layout.approximate,
                out=buffers.get('activation', h.shape, h))
            matrices = layout.matrices()
            # the gated product is written over u (a's first half)
            mixed = _mix(a, layout, matrices, buffers)
            gated = a[:, :a.shape[1] // 2]
            out = torch.addmm(b_s.to(cdtype), gated, shrink_w.t())
            del a, gated, expand_w, expand_b, shrink_w
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
            dout = dy.to(cdtype)
            if scale is not None:
                dout = dout * scale.to(cdtype)
            buffers = layout.backward_buffers()
            # the activation and the gated product, recomputed
            a = torch.ops.aten.gelu.out(
                h, approximate=layout.approximate,
                out=buffers.get('activation', h.shape, h))
            u, v = a.chunk(2, dim=1)
            gated = buffers.get('gated', u.shape, u)
            for (run, _, v_r), g_r, m in zip(
                    _run_views(u, v, layout.runs, layout.groups),
                    _run_rows(gated, layout), mixed):
                torch.mul(v_r, _token_order(m, run, v_r.shape[-1]),
                          out=g_r.view(v_r.shape))
            d_w_s = dout.t().mm(gated) if needs[5] else None
            d_b_s = dout.sum(0) if needs[6] else None
            d_gated = torch.mm(dout, shrink_w, out=buffers.get(
                'd_gated', gated.shape, dout))
            del dout
            # d(u, v) is written over a, and d(mixed) over the gated product
            d_matrices = _mix_backward(
                a, d_gated, gated, layout, [m.detach() for m in matrices],
                mixed, any(needs_gate), buffers)
            del gated, d_gated
            # GELU's backward, written over its incoming gradient
            d_h = torch.ops.aten.gelu_backward.grad_input(
                a, h, approximate=layout.approximate, grad_input=a)
            del a, u, v
            ln_input = x.to(norm_weight.dtype)
            normed = torch.sub(ln_input, mean, out=buffers.get(
                'normed', ln_input.shape, ln_input))
            normed.mul_(rstd).mul_(norm_weight).add_(norm_bias)
            d_w_e = d_h.t().mm(normed.to(cdtype)) if needs[3] else None
            d_b_e = d_h.sum(0) if needs[4] else None
            del normed
            d_normed = torch.mm(d_h, expand_w, out=buffers.get(
                'd_normed', (d_h.shape[0], expand_w.shape[1]), d_h)).to(
                norm_weight.dtype)
            del d_h
            d_x, d_norm_w, d_norm_b = \
                torch.ops.aten.native_layer_norm_backward(
                    d_normed, ln_input, (x.shape[1],), mean, rstd,
                    norm_weight, norm_bias, [needs[0], needs[1], needs[2]])
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


def _run_rows(buffer, layout):
    return buffer.split([run.rows for run in layout.runs])


def _mix(a, layout, matrices, buffers):
    """The gated product (P u + bias) * v of the halves u, v of ``a``, run
    by run, written over u. Returns each run's mixed values P u + bias
    (groups, n, windows * V), the only intermediate the backward keeps."""
    groups = layout.groups
    u, v = a.chunk(2, dim=1)
    mixed = []
    for (run, u_r, v_r), index in zip(
            _run_views(u, v, layout.runs, groups), layout.matrix_of_run):
        cols = _mixing_input(u_r, out=_cols_buffer(buffers, run, u_r))
        m = torch.bmm(_matching_dtype(matrices[index], cols),
                      cols.view(groups, run.n + 1, -1))
        del cols
        # u_r is consumed: the product goes where it was
        torch.mul(v_r, _token_order(m, run, v_r.shape[-1]), out=u_r)
        mixed.append(m)
    return mixed


def _mix_backward(a, d_gated, d_mixed_buffer, layout, matrices, mixed,
                  needs_matrices, buffers):
    """Gradients of the gated mixing. d(u, v) is written over ``a`` (the
    (T, 2K) activation whose halves are u and v; each run's values are
    read before they are overwritten), the gradient of the mixed values
    over ``d_mixed_buffer`` (T, K). Returns d(augmented matrix) per window class
    when ``needs_matrices``."""
    groups = layout.groups
    u, v = a.chunk(2, dim=1)
    d_matrices = [None] * len(matrices)
    for (run, u_r, v_r), dg_r, d_m, m, index in zip(
            _run_views(u, v, layout.runs, groups),
            d_gated.split([r.rows for r in layout.runs]),
            _run_rows(d_mixed_buffer, layout), mixed, layout.matrix_of_run):
        per_group = u_r.shape[-1]
        dg_r = dg_r.view(v_r.shape)
        # d(mixed), laid out as the matmul's output
        d_m = d_m.view(groups, run.n, run.windows, per_group)
        torch.mul(dg_r.permute(2, 1, 0, 3), v_r.permute(2, 1, 0, 3), out=d_m)
        d_m = d_m.view(groups, run.n, -1)
        # v_r is consumed: d(v) goes where it was
        torch.mul(dg_r, _token_order(m, run, per_group), out=v_r)
        matrix = _matching_dtype(matrices[index], d_m)
        cols = _mixing_input(u_r, out=_cols_buffer(buffers, run, u_r)).view(
            groups, run.n + 1, -1)
        if needs_matrices:
            d_matrix = torch.bmm(d_m, cols.transpose(1, 2))
            d_matrices[index] = d_matrix if d_matrices[index] is None \
                else d_matrices[index] + d_matrix
        # d(mixing input), into the mixing input's buffer (no longer read)
        d_cols = cols.view(-1)[:d_m.numel()].view(d_m.shape)
        torch.bmm(matrix[..., :run.n].transpose(1, 2), d_m, out=d_cols)
        u_r.copy_(_token_order(d_cols, run, per_group))
        del cols, d_cols
    return d_matrices


def _cols_buffer(buffers, run, u_r):
    """Scratch for a run's mixing input (groups, n + 1, windows, V)."""
    windows, n, groups, per_group = u_r.shape
    return buffers.get('mixing_input', (groups, n + 1, windows, per_group),
                       u_r)


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
