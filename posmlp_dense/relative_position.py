"""Relative-position geometry of a window, and resizing of position tables.

Sign conventions are the published ones. For a query m = (ym, xm) and a key
n = (yn, xn) inside a window, row-major (m = ym * ww + xm):

    dx = xn - xm,   dy = ym - yn          (GQPE offsets)
    index = (ym - yn + wh - 1) * (2 ww - 1) + (xm - xn + ww - 1)   (LRPE)

Everything here depends only on the window shape, never on parameters, so
the model keeps it in non-persistent buffers and recomputes it instead of
trusting the copies stored in published checkpoints.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F


def _grid(window: Tuple[int, int]):
    wh, ww = window
    ys, xs = torch.meshgrid(torch.arange(wh), torch.arange(ww), indexing='ij')
    return ys.reshape(-1), xs.reshape(-1)


def gqpe_features(dx: torch.Tensor, dy: torch.Tensor
                  ) -> Tuple[torch.Tensor, ...]:
    """The six features of offsets (dx, dy) against which GQPE's score
    coefficients are a dot product (gates/gqpe.py):

        (dx, dy, -dx^2 / 2, -dx dy / 2, -dy dx / 2, -dy^2 / 2)

    the offsets' linear terms, then their quadratic ones in the order of a
    flattened 2 x 2 matrix; each shaped as dx and dy."""
    return (dx, dy, -0.5 * dx * dx, -0.5 * dx * dy, -0.5 * dy * dx,
            -0.5 * dy * dy)


def gqpe_offset_features(window: Tuple[int, int]) -> torch.Tensor:
    """((2wh-1) * (2ww-1), 6) ``gqpe_features`` of every relative offset of
    a window, in the order of ``lrpe_relative_index``."""
    wh, ww = window
    rows, cols = table_grid(window)
    r = torch.arange(rows * cols)
    dy = (r // cols - (wh - 1)).float()          # ym - yn
    dx = ((ww - 1) - r % cols).float()           # xn - xm
    return torch.stack(gqpe_features(dx, dy), dim=-1)


def window_coordinates(window: Tuple[int, int]) -> torch.Tensor:
    """(2, N): the row and the column of each token of a window, in float
    (row-major order): a pair's offset is their difference."""
    ys, xs = _grid(window)
    return torch.stack([ys, xs]).float()


def lrpe_relative_index(window: Tuple[int, int]) -> torch.Tensor:
    """(N, N) index into a ((2wh-1) * (2ww-1), groups) relative table."""
    wh, ww = window
    ys, xs = _grid(window)
    rel_y = ys[:, None] - ys[None, :] + (wh - 1)
    rel_x = xs[:, None] - xs[None, :] + (ww - 1)
    return rel_y * (2 * ww - 1) + rel_x


def table_grid(window: Tuple[int, int]) -> Tuple[int, int]:
    """Shape (2wh - 1, 2ww - 1) of the relative table of a window."""
    return 2 * window[0] - 1, 2 * window[1] - 1


def resize_grid_values(values: torch.Tensor, src: Tuple[int, int],
                       dst: Tuple[int, int]) -> torch.Tensor:
    """Resize per-cell values laid out row-major on a src grid to a dst grid.

    ``values`` is (src_h * src_w, channels); the result is
    (dst_h * dst_w, channels). Rows of the grid stay rows (the first axis is
    the vertical offset for relative tables, the query row for biases).
    Bicubic, as Swin and timm resize relative tables; resizing to the same
    grid returns the input itself, bit for bit.
    """
    src, dst = tuple(src), tuple(dst)
    if values.dim() != 2 or values.shape[0] != src[0] * src[1]:
        raise ValueError(f'expected ({src[0]} * {src[1]}, channels) values, '
                         f'got shape {tuple(values.shape)}')
    if src == dst:
        return values
    channels = values.shape[1]
    grid = values.t().reshape(1, channels, src[0], src[1]).float()
    out = F.interpolate(grid, size=dst, mode='bicubic', align_corners=False)
    return out.reshape(channels, dst[0] * dst[1]).t().contiguous().to(
        values.dtype)


def resize_relative_table(table: torch.Tensor, src_window: Tuple[int, int],
                          dst_window: Tuple[int, int]) -> torch.Tensor:
    """Resize an LRPE table ((2wh-1)(2ww-1), groups) to another window."""
    return resize_grid_values(table, table_grid(src_window),
                              table_grid(dst_window))


def resize_position_bias(bias: torch.Tensor, src_window: Tuple[int, int],
                         dst_window: Tuple[int, int]) -> torch.Tensor:
    """Resize a per-position bias (1, wh*ww, 1) to another window."""
    flat = bias.reshape(-1, 1)
    out = resize_grid_values(flat, src_window, dst_window)
    return out.reshape(1, -1, 1) if out is not flat else bias


def infer_window(num_positions: int, table_len: Optional[int] = None,
                 prefer: Optional[Tuple[int, int]] = None) -> Tuple[int, int]:
    """Recover (wh, ww) from N = wh * ww and, if given, the table length.

    A square window needs only N. A rectangular one is solved from
    (2wh-1)(2ww-1) = table_len; the two orientations are told apart by
    ``prefer`` (the model's own window), whose orientation wins. Without a
    table, N positions that ``prefer`` has too are taken to be ``prefer``
    (a GQPE checkpoint of a rectangular window records only N).
    """
    side = math.isqrt(num_positions)
    if table_len is None:
        if prefer is not None and prefer[0] * prefer[1] == num_positions:
            return tuple(prefer)
        if side * side != num_positions:
            raise ValueError(f'cannot tell the window of a {num_positions}-'
                             f'position bias: it is not a square')
        return side, side
    # wh + ww = (4N + 1 - L) / 2 and wh * ww = N
    total2 = 4 * num_positions + 1 - table_len
    if total2 <= 0 or total2 % 2:
        raise ValueError(f'a relative table of {table_len} rows does not fit '
                         f'a window of {num_positions} positions')
    total = total2 // 2
    disc = total * total - 4 * num_positions
    root = math.isqrt(max(disc, 0))
    if disc < 0 or root * root != disc or (total + root) % 2:
        raise ValueError(f'a relative table of {table_len} rows does not fit '
                         f'a window of {num_positions} positions')
    a, b = (total + root) // 2, (total - root) // 2
    if prefer is not None and prefer[0] < prefer[1]:
        return b, a
    return a, b
