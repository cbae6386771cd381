"""Window logic: how a level's (B, H, W, C) map is cut into windows.

The published model cuts a map into w x w windows and requires the map to be
a multiple of the window. We accept any map size. Instead of padding the map
and masking the padded tokens, we never create padded tokens at all: a window
that sticks out of the map keeps only its real tokens, and its mixing matrix
is the full window's matrix restricted to those tokens (for GQPE the softmax
then runs over the real keys only). That is exactly what "pad, then mask the
padded keys out" computes, without spending work on padding.

Windows are grouped into *classes* of equal shape: interior windows, the
partial windows along the bottom and right edges, and the corner (and, for
shifted windows, the partial windows along the top and left). Each class is
stored window by window, as a (B * windows, n, C) block of one flat (T, C)
token buffer, where n is the number of real tokens per window of that class
(the published (b, windows, n, C) order when the windows tile the map). The
token mixing of a whole class is one batched matmul (groups x n x n) @
(groups x n x columns); any run of consecutive windows is a contiguous range
of rows, so inference can also work through a level in cache-sized runs
(``WindowPlan.runs``).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Optional, Tuple

import torch


@dataclass(frozen=True)
class Segment:
    """A run of equal windows along one axis of the map."""
    start: int   # first map index covered by the run
    count: int   # number of windows in the run
    size: int    # real tokens per window along this axis
    offset: int  # in-window index of the first real token


@dataclass(frozen=True)
class WindowClass:
    """Windows that share one shape of real tokens inside the full window."""
    rows: Segment
    cols: Segment

    @property
    def tokens(self) -> int:
        return self.rows.size * self.cols.size

    @property
    def windows_per_sample(self) -> int:
        return self.rows.count * self.cols.count

    @property
    def key(self) -> Tuple[int, int, int, int]:
        """In-window rectangle (r0, r1, c0, c1): all the mixing depends on."""
        r, c = self.rows, self.cols
        return (r.offset, r.offset + r.size, c.offset, c.offset + c.size)


@dataclass(frozen=True)
class WindowRun:
    """Consecutive windows of one class: rows [start, start + rows) of the
    token buffer, ``windows`` windows of ``n`` tokens each."""
    key: Tuple[int, int, int, int]  # the class's in-window rectangle
    n: int
    windows: int
    start: int

    @property
    def rows(self) -> int:
        return self.n * self.windows


def axis_segments(length: int, window: int, origin: int = 0
                  ) -> Tuple[Segment, ...]:
    """Cut an axis of ``length`` tokens into windows of ``window`` tokens.

    The window grid starts at map index ``origin`` (0 <= origin < window):
    with ``origin > 0`` (shifted windows) the first ``origin`` tokens form a
    leading partial window whose real tokens sit at the end of the window.
    """
    if length <= 0:
        raise ValueError(f'cannot cut an axis of length {length} into windows')
    if not 0 <= origin < window:
        raise ValueError(f'window origin {origin} must be in [0, {window})')
    segments = []
    pos = 0
    if origin > 0:
        lead = min(origin, length)
        segments.append(Segment(0, 1, lead, window - origin))
        pos = lead
    full = (length - pos) // window
    if full:
        segments.append(Segment(pos, full, window, 0))
        pos += full * window
    if pos < length:
        segments.append(Segment(pos, 1, length - pos, 0))
    return tuple(segments)


@lru_cache(maxsize=256)
def make_plan(height: int, width: int, window: Tuple[int, int],
              shift: Tuple[int, int] = (0, 0)) -> 'WindowPlan':
    rows = axis_segments(height, window[0], shift[0])
    cols = axis_segments(width, window[1], shift[1])
    classes = tuple(WindowClass(r, c) for r in rows for c in cols)
    return WindowPlan(height, width, tuple(window), classes)


@dataclass(frozen=True)
class WindowPlan:
    """How one map size is cut into windows: a fixed list of classes."""
    height: int
    width: int
    window: Tuple[int, int]
    classes: Tuple[WindowClass, ...]

    @property
    def exact(self) -> bool:
        """True when windows tile the map and no window is partial."""
        return len(self.classes) == 1 and self.classes[0].tokens == (
            self.window[0] * self.window[1])

    def class_sizes(self, batch: int):
        """(tokens, windows) of each class for a batch, in buffer order."""
        return [(c.tokens, batch * c.windows_per_sample) for c in self.classes]

    def num_tokens(self, batch: int) -> int:
        return batch * self.height * self.width

    def runs(self, batch: int, max_rows: Optional[int] = None
             ) -> Tuple[WindowRun, ...]:
        """The token buffer as runs of windows, in buffer order: one per
        class, or with ``max_rows`` cut into runs of at most that many rows
        (but at least one window)."""
        runs = []
        start = 0
        for cls in self.classes:
            n, windows = cls.tokens, batch * cls.windows_per_sample
            step = windows if max_rows is None else max(1, max_rows // n)
            for first in range(0, windows, step):
                count = min(step, windows - first)
                runs.append(WindowRun(cls.key, n, count, start))
                start += n * count
        return tuple(runs)

    def partition(self, x: torch.Tensor, fresh: bool = False) -> torch.Tensor:
        """(B, H, W, C) map -> (T, C) token buffer, class by class.

        With ``fresh`` the buffer never shares memory with ``x`` (the
        in-place inference path then owns it)."""
        B, H, W, C = x.shape
        assert (H, W) == (self.height, self.width), 'plan built for another size'
        if len(self.classes) == 1 and not fresh:
            return self._class_view(x, self.classes[0]).reshape(-1, C)
        if _records_autograd(x):
            return _Rearrange.apply(x, self, B, True)
        return self._partition_copy(x)

    def reverse(self, tokens: torch.Tensor, batch: int) -> torch.Tensor:
        """(T, C) token buffer -> contiguous (B, H, W, C) map."""
        C = tokens.shape[-1]
        B = batch
        if len(self.classes) == 1:
            cls = self.classes[0]
            return tokens.view(B, cls.rows.count, cls.cols.count,
                               cls.rows.size, cls.cols.size, C).permute(
                0, 1, 3, 2, 4, 5).reshape(B, self.height, self.width, C)
        if _records_autograd(tokens):
            return _Rearrange.apply(tokens, self, B, False)
        return self._reverse_copy(tokens, B)

    def _partition_copy(self, x: torch.Tensor) -> torch.Tensor:
        out = x.new_empty(self.num_tokens(x.shape[0]), x.shape[-1])
        for region, block in self._class_pairs(x, out):
            block.copy_(region)
        return out

    def _reverse_copy(self, tokens: torch.Tensor, batch: int) -> torch.Tensor:
        out = tokens.new_empty(batch, self.height, self.width,
                               tokens.shape[-1])
        for region, block in self._class_pairs(out, tokens):
            region.copy_(block)
        return out

    def _class_pairs(self, x: torch.Tensor, tokens: torch.Tensor):
        """Per class: its windows in the (B, H, W, C) map ``x`` and its
        block of the (T, C) buffer ``tokens``, both (B, nr, nc, h, w, C)."""
        B, C = x.shape[0], x.shape[-1]
        offset = 0
        for cls in self.classes:
            n = cls.tokens * B * cls.windows_per_sample
            yield self._class_view(x, cls), tokens[offset:offset + n].view(
                B, cls.rows.count, cls.cols.count, cls.rows.size,
                cls.cols.size, C)
            offset += n

    @staticmethod
    def _class_view(x: torch.Tensor, cls: WindowClass) -> torch.Tensor:
        """View of a class's windows in ``x`` as (B, nr, nc, h, w, C)."""
        B, _, _, C = x.shape
        r, c = cls.rows, cls.cols
        region = x[:, r.start:r.start + r.count * r.size,
                   c.start:c.start + c.count * c.size]
        return region.view(B, r.count, r.size, c.count, c.size, C).permute(
            0, 1, 3, 2, 4, 5)

    def per_sample(self, values: torch.Tensor) -> torch.Tensor:
        """Spread a per-sample (B,) tensor over the token buffer: (T, 1)."""
        B = values.shape[0]
        parts = [values.view(B, 1).expand(
            B, cls.windows_per_sample * cls.tokens).reshape(-1)
                 for cls in self.classes]
        return (parts[0] if len(parts) == 1 else torch.cat(parts)).unsqueeze(1)


def _records_autograd(x: torch.Tensor) -> bool:
    return x.requires_grad and torch.is_grad_enabled()


class _Rearrange(torch.autograd.Function):
    """A map <-> token buffer copy of a WindowPlan with several classes, as
    one autograd node. Every element moves to exactly one place (the classes
    tile the map), so the gradient moves back by the inverse copy. Autograd
    through the per-class copies instead clones and zero-fills the whole
    gradient once per class (CopySlices), and zero-fills a full-size
    gradient for every sliced view: at stage 1 that was several passes over
    a 12 MB buffer per copy."""

    @staticmethod
    def forward(ctx, x, plan, batch, to_tokens):
        ctx.plan, ctx.batch, ctx.to_tokens = plan, batch, to_tokens
        if to_tokens:
            return plan._partition_copy(x)
        return plan._reverse_copy(x, batch)

    @staticmethod
    def backward(ctx, grad):
        # through the Function again, so a double backward works too
        grad = grad.contiguous()
        if ctx.to_tokens:
            return ctx.plan.reverse(grad, ctx.batch), None, None, None
        return ctx.plan.partition(grad), None, None, None


def in_window_index(key: Tuple[int, int, int, int], window: Tuple[int, int],
                    device=None) -> torch.Tensor:
    """Row-major in-window indices m = y * ww + x of a class's real tokens."""
    r0, r1, c0, c1 = key
    ys = torch.arange(r0, r1, device=device)
    xs = torch.arange(c0, c1, device=device)
    return (ys[:, None] * window[1] + xs[None, :]).reshape(-1)


class PaddedWindows:
    """Windows for a captured graph (torch.compile / torch.export / ONNX / FX),
    where map sizes may be symbolic.

    The map is cut into whole windows, (B * windows, n) tokens, one class of
    full windows that covers the map plus padding; ``token_mask`` (T, 1)
    marks the real tokens. The gates take padded keys out
    of the mixing (u is zeroed there, and GQPE's softmax is renormalized
    over the real keys), so a real token's output is the one of the exact
    partial window; padded tokens are computed and cropped away.

    The layout is built with index arithmetic and gathers, never with views
    of padded maps: a view's strides make the tracer guard on sizes (e.g.
    "is the padding zero", "is there one window"), which would tie the graph
    to the capture size. With gathers the same graph holds at every size.

    ``origin`` (shifted windows) is where the window grid starts, as in
    ``axis_segments``.
    """

    def __init__(self, x: torch.Tensor, window: Tuple[int, int],
                 origin: Tuple[int, int] = (0, 0)):
        # (size() by dimension: an FX proxy's shape cannot be unpacked)
        B, H, W = x.size(0), x.size(1), x.size(2)
        wh, ww = window
        self.height, self.width = H, W
        self.window = tuple(window)
        self.n = wh * ww
        # leading padding puts the grid's first line at ``origin``
        top, left = (wh - origin[0]) % wh, (ww - origin[1]) % ww
        rows = (top + H + wh - 1) // wh
        cols = (left + W + ww - 1) // ww
        self.tokens_per_sample = rows * cols * self.n
        # map row/column of every padded token, in window order
        k = torch.arange(self.tokens_per_sample, device=x.device)
        window_index, pos = k // self.n, k % self.n
        ys = (window_index // cols) * wh + pos // ww - top
        xs = _remainder(window_index, cols) * ww + pos % ww - left
        real = (ys >= 0) & (ys < H) & (xs >= 0) & (xs < W)
        # padded tokens copy a real one (any finite value; they are masked)
        self.source = ys.clamp(0, H - 1) * W + xs.clamp(0, W - 1)
        # token of every real map position (row-major), for the way back
        q = torch.arange(H * W, device=x.device)
        ym, xm = q // W + top, _remainder(q, W) + left
        self.target = ((ym // wh) * cols + xm // ww) * self.n + \
            (ym % wh) * ww + xm % ww
        # the masks of the whole batch, from its own flat index (a repeat or
        # a merging view would make the tracer guard on "one window")
        whole = torch.arange(B * self.tokens_per_sample, device=x.device)
        real = real.index_select(
            0, _remainder(whole, self.tokens_per_sample)).to(torch.float32)
        self.token_mask = real.unsqueeze(1)                  # (T, 1)
        self.position_in_window = whole % self.n             # (T,)

    def partition(self, x: torch.Tensor) -> torch.Tensor:
        """(B, H, W, C) map -> (B * windows * n, C) padded tokens."""
        B, C = x.shape[0], x.shape[-1]
        flat = x.reshape(B, self.height * self.width, C)
        return flat.index_select(1, self.source).reshape(-1, C)

    def reverse(self, tokens: torch.Tensor, batch) -> torch.Tensor:
        """Padded tokens -> (B, H, W, C) map of the real tokens."""
        C = tokens.shape[-1]
        per_sample = tokens.view(batch, self.tokens_per_sample, C)
        return per_sample.index_select(1, self.target).view(
            batch, self.height, self.width, C)

    def per_sample(self, values: torch.Tensor) -> torch.Tensor:
        """Spread a per-sample (B,) tensor over the tokens: (T, 1)."""
        return values.repeat_interleave(self.tokens_per_sample).view(-1, 1)


def _remainder(index: torch.Tensor, divisor) -> torch.Tensor:
    """``index % divisor`` for a possibly symbolic divisor, spelled with a
    floor division (ONNX export has no remainder by a symbolic scalar)."""
    return index - (index // divisor) * divisor
