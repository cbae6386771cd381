"""Windows: how a level's map is cut into wh x ww windows, at any size.

The published model cuts a (B, H, W, C) map into windows and needs H and W
to be multiples of the window. We take any size, exactly: a window that
sticks out of the map mixes its real tokens only, as if the map had been
cut there.

Everything per token (LayerNorm, the projections, GELU, the gating product)
runs on the real tokens alone, in map order. Only the gate's mixed half u
passes through the window layout, once per block: ``to_windows`` pads it
with zeros to whole windows and lays each window's tokens out as one row of
N = wh * ww values, so that one batched matmul mixes every window of the
level, whatever the map size (token_mixing.py). In eager PyTorch that is one
scatter of the real tokens into a zeroed layout, which the grid keeps for
the next block while autograd does not record (the padded tokens stay zero:
no block writes them). A zero key adds nothing to a
weighted sum, so a real query of a partial window sees only its real keys;
gates whose rows are a softmax over the window are then renormalized over
those keys (``key_mask`` and token_mixing.key_scale). ``to_map`` brings the
result back in one gather of the real queries (``map_index``), so the
padded ones are never copied again.

All sizes here are plain arithmetic on the map's size, with no branch on
it: under torch.compile and torch.export they stay symbolic, and one graph
holds at every input size.
"""
from __future__ import annotations

from typing import List, NamedTuple, Optional, Tuple

import torch


class GatherIndices(NamedTuple):
    """A grid's gather indices (``WindowGrid._gather_indices``)."""
    rows: torch.Tensor       # (windows * N,) map row each token copies
    cols: torch.Tensor       # (windows * N,) map column each token copies
    real: torch.Tensor       # (windows * N,) True where a token is real
    map_index: torch.Tensor  # (H * W,) see WindowGrid.map_index
    in_window: torch.Tensor  # (H * W,) see in_window_index_on_map


class WindowGrid:
    """The windows of one (height, width) map: a grid of ``rows`` x ``cols``
    windows starting ``top`` tokens above and ``left`` tokens left of the
    map (the leading padding; non-zero only for shifted windows).

    ``gathers``: cut u into windows with index arithmetic and a gather, and
    compute ``map_index`` by arithmetic, instead of a scatter and a view of
    a padded map's positions. Both give the same layout, bit for bit. A
    captured graph needs the gathers: a view of a padded map makes the
    tracer guard on sizes (that a map holds more than one window, say),
    which would tie the graph to sizes like the capture's. Eager PyTorch
    scatters into a zeroed layout instead, which it keeps for the next
    block (``to_windows``'s ``slot``).
    """

    def __init__(self, height, width, window: Tuple[int, int], top=0, left=0,
                 gathers: bool = False):
        self.height, self.width = height, width
        self.window = tuple(window)
        self.top, self.left = top, left
        self.gathers = gathers
        wh, ww = self.window
        self.rows = (top + height + wh - 1) // wh
        self.cols = (left + width + ww - 1) // ww
        self._indices = None
        self._map_index = None
        self._zeroed = {}
        self._release_claimed = False

    @property
    def tokens(self) -> int:
        """N: tokens of a whole window."""
        return self.window[0] * self.window[1]

    @property
    def padded_tokens(self):
        """Tokens of one sample in the window layout: windows * N."""
        return self.rows * self.cols * self.tokens

    def padding(self):
        """(left, right, top, bottom), in F.pad's order."""
        wh, ww = self.window
        return (self.left, self.cols * ww - self.left - self.width,
                self.top, self.rows * wh - self.top - self.height)

    def to_windows(self, t: torch.Tensor, groups: int,
                   slot: Optional[str] = None) -> torch.Tensor:
        """(K, B, H, W) channel-major map -> (groups, K/groups * B * windows,
        N), zero at padded tokens.

        A channel k is in group k % groups (the published order), so each
        group's rows come out together: one matmul per group then mixes
        every window of every channel of the group.

        ``slot``: in eager PyTorch with autograd not recording, the layout is
        the grid's zeroed buffer of that name, kept for the next call with
        the same slot, shape and dtype: only the real tokens are written
        (its padded ones stay zero), and the result is valid until that
        next call. Otherwise (or with no slot) a new layout is made."""
        K, B = t.shape[0], t.shape[1]
        wh, ww = self.window
        if self.gathers:
            # (the views below only merge dimensions, or split off N: a
            # dimension of bare window count would make the tracer guard
            # on whether it is 1; and the copy keeps B as a dimension of
            # its own, so that no view of it has the result's rank, whose
            # last size inductor's pointless-view pass would compare with
            # windows * N, guarding on whether a sample has one window.
            # The indices go in as (windows * wh, ww), so that a compiler
            # loops over each window row's ww tokens innermost, which
            # inductor's CPU code vectorizes, GELU inlined there included;
            # and as a row and a column, not one flat map position, whose
            # split back into the map's two dimensions gives the compiler
            # a modulus of clamped sums to simplify with symbolic sizes:
            # minutes of inductor's vectorization analysis on a CPU.)
            index = self._gather_indices(t.device)
            picked = t[:, :, index.rows.view(-1, ww),
                       index.cols.view(-1, ww)] * \
                index.real.view(-1, ww).to(t.dtype)
            picked = picked.view(K // groups, groups, B, -1, ww).transpose(
                0, 1)
            return picked.contiguous().view(groups, -1).view(groups, -1,
                                                             wh * ww)
        shape = (groups, K // groups, B, self.padded_tokens)
        if slot is None or torch.is_grad_enabled():
            layout = t.new_zeros(shape)
        else:
            layout = self._zeroed_layout(slot, shape, t)
        # channel k = c * groups + g at [g, c], as a view of t
        grouped = t.reshape(K // groups, groups, B, self.height * self.width
                            ).transpose(0, 1)
        layout.index_copy_(3, self.map_index(t.device), grouped)
        return layout.view(groups, -1, wh * ww)

    def _zeroed_layout(self, slot: str, shape, like: torch.Tensor
                       ) -> torch.Tensor:
        """The grid's zeroed window layout ``slot`` of ``shape`` and
        ``like``'s dtype and device (made zero on first use)."""
        key = (slot, like.dtype, like.device)
        layout = self._zeroed.get(key)
        if layout is None or tuple(layout.shape) != tuple(shape):
            layout = like.new_zeros(shape)
            self._zeroed[key] = layout
        return layout

    def release_layouts(self):
        """Drop the kept layouts (``to_windows``'s ``slot``): a level does
        after its blocks, and the first block's backward does after its
        own, so that none outlives the pass that uses it."""
        if self._zeroed:
            self._zeroed.clear()

    def claim_release(self) -> bool:
        """True on the first call only: the caller (a level's first block
        on this grid, whose backward runs last) releases the layouts after
        its backward. Always False with gathers: a captured graph keeps no
        layouts (and a backward with side effects would not be captured
        whole)."""
        if self.gathers:
            return False
        first = not self._release_claimed
        self._release_claimed = True
        return first

    def to_map(self, w: torch.Tensor) -> torch.Tensor:
        """``to_windows``'s rows back in map order: (groups, V * B * windows,
        N) -> (groups * V * B, H * W), the padded tokens dropped. Channels
        stay grouped: channel k = v * groups + g is in row (g * V + v) * B
        + b. (The caller, who knows V and B, splits the rows.)"""
        flat = w.reshape(w.shape[0], -1).view(-1, self.padded_tokens)
        return flat.index_select(1, self.map_index(w.device))

    def key_mask(self, like: torch.Tensor) -> torch.Tensor:
        """(windows * N,): 1 where a token of the window layout is real, 0
        where padded (``like``'s dtype and device)."""
        if self.gathers:
            return self._gather_indices(like.device).real.to(like.dtype)
        return like.new_zeros(self.padded_tokens).index_fill_(
            0, self.map_index(like.device), 1)

    def map_index(self, device) -> torch.Tensor:
        """(H * W,): where each token of the map, in map order, sits in one
        sample's window layout (its window * N + its in-window index)."""
        if self.gathers:
            return self._gather_indices(device).map_index
        if self._map_index is None:
            wh, ww = self.window
            layout = torch.arange(self.padded_tokens, device=device).view(
                self.rows, self.cols, wh, ww)
            padded = layout.permute(0, 2, 1, 3).reshape(self.rows * wh,
                                                        self.cols * ww)
            self._map_index = padded[self.top:self.top + self.height,
                                     self.left:self.left + self.width
                                     ].reshape(-1)
        return self._map_index

    def in_window_index_on_map(self, device) -> torch.Tensor:
        """(H * W,): each token of the map, in map order, as the index of
        its position in its window (``map_index`` modulo N)."""
        if self.gathers:
            return self._gather_indices(device).in_window
        return self.map_index(device) % self.tokens

    def _gather_indices(self, device) -> GatherIndices:
        """For the window layout of one sample: the map row and column
        each token copies (any real one where padded), which tokens are
        real, and, per map position, its token (``map_index``) and its
        index in its window (``in_window_index_on_map``)."""
        if self._indices is None:
            wh, ww = self.window
            n = wh * ww
            k = torch.arange(self.padded_tokens, device=device)
            window, pos = k // n, index_remainder(k, n)
            ys = (window // self.cols) * wh + pos // ww - self.top
            xs = index_remainder(window, self.cols) * ww + \
                index_remainder(pos, ww) - self.left
            real = (ys >= 0) & (ys < self.height) & (xs >= 0) & \
                (xs < self.width)
            rows = ys.clamp(0, self.height - 1)
            cols = xs.clamp(0, self.width - 1)
            # per map row and per map column, then summed over the (H, W)
            # map: a compiler inlines these into the kernels that gather
            # with them, and an index split per axis costs a few integer
            # operations per element where one flat position costs dozens
            # (inductor then realizes the gate's output apart from the
            # product with v, once its operations pass a threshold)
            ym = torch.arange(self.height, device=device) + self.top
            xm = torch.arange(self.width, device=device) + self.left
            row_in, col_in = index_remainder(ym, wh), index_remainder(xm, ww)
            in_window = (row_in * ww).unsqueeze(1) + col_in
            target = ((ym // wh) * (self.cols * n)).unsqueeze(1) + \
                (xm // ww) * n + in_window
            self._indices = GatherIndices(rows, cols, real, target.view(-1),
                                          in_window.view(-1))
        return self._indices

    def spans(self, axis: int) -> List[Tuple[int, int]]:
        """[(first, last)] map indices of the real tokens of each window
        along ``axis`` (0: rows, 1: columns), in order."""
        size = (self.height, self.width)[axis]
        lead = (self.top, self.left)[axis]
        side = self.window[axis]
        count = (self.rows, self.cols)[axis]
        out = []
        for i in range(count):
            first = max(i * side - lead, 0)
            last = min((i + 1) * side - lead, size) - 1
            out.append((first, last))
        return out


def index_remainder(index: torch.Tensor, divisor) -> torch.Tensor:
    """``index % divisor`` spelled with a floor division, for the window
    indices' arithmetic. ONNX export has no remainder by a symbolic scalar;
    and inductor turns this spelling into index expressions of its loop
    variables, where it keeps ``%`` of a value it cannot prove
    non-negative as integer arithmetic on every element of the kernels
    that index with it (the gate's output)."""
    return index - (index // divisor) * divisor


def window_grid(height: int, width: int, window: Tuple[int, int],
                origin: Tuple[int, int] = (0, 0),
                gathers: bool = False) -> WindowGrid:
    """The grid of windows of a map whose window lines start at map index
    ``origin`` (0 <= origin < window; (0, 0) unless windows are shifted).
    With ``origin > 0`` the first ``origin`` tokens of that axis form a
    leading partial window whose real tokens sit at its end. ``gathers``:
    see WindowGrid."""
    for o, side in zip(origin, window):
        if not 0 <= o < side:
            raise ValueError(f'window origin {origin} must lie in [0, '
                             f'{tuple(window)})')
    wh, ww = window
    return WindowGrid(height, width, tuple(window), (wh - origin[0]) % wh,
                      (ww - origin[1]) % ww, gathers)


def in_window_index(rect: Tuple[int, int, int, int],
                    window: Tuple[int, int], device=None) -> torch.Tensor:
    """Row-major in-window indices m = y * ww + x of the tokens of the
    rectangle (r0, r1, c0, c1) of a window."""
    r0, r1, c0, c1 = rect
    ys = torch.arange(r0, r1, device=device)
    xs = torch.arange(c0, c1, device=device)
    return (ys[:, None] * window[1] + xs[None, :]).reshape(-1)
