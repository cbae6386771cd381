"""What the check runs: the full profile for the GPU machine, and a tiny
one (small model, small inputs, few repeats) for dry runs on a CPU."""
from __future__ import annotations

import dataclasses
from typing import Dict, Tuple, Union

from posmlp_dense.archs import ARCH_SETTINGS

# A reduced PosMLP with PosMLP-T's windows (14, 14, 14, 7), so the sizes
# below cover its windows exactly as they cover PosMLP-T's.
TINY_ARCH = dict(embed_dims=(16, 32, 64, 128), depths=(1, 1, 2, 1),
                 mlp_ratio=(4, 4, 4, 2), gamma=(4, 8, 16, 32),
                 window_size=(14, 14, 14, 7))

# PosMLP-T's widths, gates and windows with one block per level: the
# export check's graph has every kind of node PosMLP-T's has, at a sixth of
# its size (exporting all 24 blocks takes minutes of Python on one core).
T_ONE_BLOCK = dict(ARCH_SETTINGS['t'], depths=(1, 1, 1, 1))

# Input sizes of the device-against-CPU comparison. With windows
# (14, 14, 14, 7) at strides 4, 8, 16, 32 the level maps are 56x56 ...
# 7x7 (every level tiled by whole windows), 50x58 ... 7x8 (partial windows
# at the edges of every level) and 10x12 ... 2x2 (every level smaller than
# one window).
COMPARISON_SIZES: Dict[str, Tuple[int, int]] = {
    'tiled': (224, 224),
    'untiled': (200, 232),
    'smaller than a window': (40, 48),
}


@dataclasses.dataclass(frozen=True)
class Profile:
    name: str
    arch: Union[str, dict]
    comparison_batch: int
    autocast_shape: Tuple[int, int, int]   # batch, height, width
    train_shape: Tuple[int, int, int]      # training, speed and compile
    # further (height, width) sizes that the compiled training step must
    # run without compiling again
    compile_sizes: Tuple[Tuple[int, int], ...]
    train_steps: int
    warmup: int                            # speed and compile rows
    repeats: int
    export_arch: Union[str, dict]
    export_shape: Tuple[int, int, int]
    detector_shape: Tuple[int, int, int]
    detector_warmup: int
    detector_repeats: int

    @property
    def posmlp_label(self) -> str:
        return 'PosMLP-T' if self.arch == 't' else 'PosMLP (tiny arch)'

    @property
    def export_label(self) -> str:
        return ('PosMLP-T, 1 block per level'
                if self.export_arch == T_ONE_BLOCK else self.posmlp_label)


FULL = Profile(
    name='full', arch='t', comparison_batch=1,
    autocast_shape=(2, 200, 232), train_shape=(2, 800, 1333), train_steps=3,
    compile_sizes=((736, 1333), (800, 1216), (832, 1344), (768, 1280),
                   (704, 1024), (864, 1152)),
    warmup=3, repeats=10, export_arch=T_ONE_BLOCK,
    export_shape=(2, 512, 512),
    detector_shape=(2, 800, 1333), detector_warmup=2, detector_repeats=5)

TINY = Profile(
    name='tiny', arch=TINY_ARCH, comparison_batch=1,
    autocast_shape=(1, 48, 64), train_shape=(1, 48, 70), train_steps=2,
    # (every size below 6,827 pixels, where torch's CPU convolution shape
    # function branches on C * H * W > 20480, and with more than one
    # window at the first level, whose single-window case is another graph)
    compile_sizes=((40, 70), (56, 64), (48, 90), (64, 60), (52, 76),
                   (60, 84)),
    warmup=1, repeats=2, export_arch=TINY_ARCH, export_shape=(2, 64, 96),
    detector_shape=(1, 64, 90), detector_warmup=1, detector_repeats=1)
