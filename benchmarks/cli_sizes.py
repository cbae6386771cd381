"""Sizes written on a command line: 'HxW', 'BxHxW', 'BxCxHxW'.

One parser for every tool, so that each refuses the same things (a zero or
negative size, a missing or extra part) with a message naming the layout.
"""
from __future__ import annotations

import argparse
from typing import Tuple

_EXAMPLE = dict(B='2', C='3', H='512', W='512')


def parse_dims(text: str, layout: str, square: bool = False
               ) -> Tuple[int, ...]:
    """``text`` read as ``layout`` (e.g. 'BxHxW'): one positive integer per
    letter, joined by 'x'. With ``square``, layout 'HxW' also takes a
    single integer S for SxS.

    Raises argparse.ArgumentTypeError, so that a function wrapping this one
    can serve as an argparse ``type``."""
    names = layout.split('x')
    parts = text.strip().lower().split('x')
    if square and names == ['H', 'W'] and len(parts) == 1:
        parts = parts * 2
    if len(parts) != len(names) or not all(
            p.isascii() and p.isdigit() and int(p) > 0 for p in parts):
        example = 'x'.join(_EXAMPLE.get(name, '8') for name in names)
        shorthand = ' or S (square)' if square else ''
        raise argparse.ArgumentTypeError(
            f'{text!r}: expected {len(names)} positive sizes '
            f'{layout}{shorthand}, e.g. {example}')
    return tuple(int(p) for p in parts)


def input_shape(text: str) -> Tuple[int, int, int, int]:
    """'BxCxHxW' -> (B, C, H, W), positive sizes; an argparse ``type``."""
    return parse_dims(text, 'BxCxHxW')
