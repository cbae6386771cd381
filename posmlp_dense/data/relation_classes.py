"""A built-in classification set whose classes are *where* things are.

Every image shows a circle and a triangle on a random textured background
(drawn like the other built-in sets, :mod:`.shapes`); the class says where
the triangle sits relative to the circle: ``above``, ``below``, ``left`` or
``right`` of it (by the direction from the circle's centre to the
triangle's). Telling the classes apart needs both shapes' kinds *and* their
relative position, the thing a token mixer's positional weights encode, so
this set can separate the gates (``tools/ablate_gates.py``), where one shape
per image (:mod:`.shape_classes`) may not. As an ImageFolder tree::

    <root>/train/above/demo_train_00000.jpg ...
    <root>/train/below/... <root>/train/left/... <root>/train/right/...
    <root>/val/above/demo_val_00000.jpg ...
    <root>/manifest.json

Image ``i`` of a split has class ``i % 4`` (in :data:`CLASSES` order), so
the classes are exactly balanced when a split's size is a multiple of four
(chance top-1 is then 25%). The direction is drawn uniformly inside its
class's 90-degree sector, kept ``margin`` degrees away from the sector's
borders so that no label is a coin toss. Each image comes from its own
random stream, derived from (seed, split, index): the same seed and
parameters give byte-identical files, and :func:`check_labels` re-draws
every image of a tree and checks its folder against the painted pixels.
A set already there with the same parameters and intact files is kept.
"""
from __future__ import annotations

import math
import os
import re
import time
from typing import Dict, List, Sequence, Tuple

import numpy as np

from .shape_classes import check_set_sizes, write_balanced_image_folders
from .shapes import (_background, _jpeg_bytes, _pick_colour, _polygon,
                     _rasterize, _read_manifest)

__all__ = ['CLASSES', 'check_labels', 'default_root', 'direction_class',
           'make_relation_set', 'render_relation']

#: Where the triangle is relative to the circle; sorted, the ImageFolder
#: reader's order.
CLASSES = ('above', 'below', 'left', 'right')
# Centre of each class's sector, degrees, image axes (x right, y down).
_SECTOR_CENTRE = {'right': 0.0, 'below': 90.0, 'left': 180.0, 'above': 270.0}
KIND = 'relations'
DEFAULT_IMAGE_SIZE = 64
# Shape extent relative to the image side: 10-18 pixels at 64 x 64, small
# enough that the two shapes sit well apart in most images.
DEFAULT_SIZE_RANGE = (0.16, 0.28)
DEFAULT_MARGIN_DEGREES = 10.0
# The gate ablation's set. 3200 training images rather than 1600: at the
# same number of training steps (6 epochs of 3200 against 12 of 1600) the
# runs ended higher and their seeds agreed more closely, which is what lets
# the ablation tell the gates apart (docs/positional_encoding.md).
DEFAULT_NUM_TRAIN = 3200
DEFAULT_NUM_VAL = 400
SPLITS = ('train', 'val')
_SET_CODE = 3  # 0, 1, 2: the detection, segmentation and shape-class sets
_MAX_PLACEMENTS = 200
_GAP = 2  # pixels between the two shapes' bounding circles
_FILE_NAME = re.compile(r'^demo_(train|val)_(\d{5})\.jpg$')


def direction_class(dx: float, dy: float) -> str:
    """The class of a triangle at offset (dx, dy) from the circle, image
    axes (y down): the sector of the direction, 90 degrees each."""
    angle = math.degrees(math.atan2(dy, dx)) % 360.0
    for name, centre in _SECTOR_CENTRE.items():
        if abs((angle - centre + 180.0) % 360.0 - 180.0) < 45.0:
            return name
    return 'right'  # exactly on a border (never drawn: see margin)


def _placement(rng: np.random.Generator, size: int, label: str,
               r_circle: float, r_triangle: float, margin: float
               ) -> Tuple[np.ndarray, np.ndarray]:
    """Centres (x, y) of the circle and the triangle: the direction inside
    ``label``'s sector (``margin`` degrees from its borders), the distance
    anywhere from touching (plus a gap) to what the image allows."""
    for _ in range(_MAX_PLACEMENTS):
        angle = math.radians(_SECTOR_CENTRE[label] +
                             rng.uniform(-45.0 + margin, 45.0 - margin))
        unit = np.array([math.cos(angle), math.sin(angle)])
        near = r_circle + r_triangle + _GAP
        distance = rng.uniform(near, max(near, 0.75 * size))
        lo = np.maximum(r_circle, r_triangle - distance * unit) + 1
        hi = np.minimum(size - r_circle, size - r_triangle -
                        distance * unit) - 1
        if np.all(lo < hi):
            circle = rng.uniform(lo, hi)
            return circle, circle + distance * unit
    raise RuntimeError(f'no placement of two shapes in a {size} x {size} '
                       f'image in {_MAX_PLACEMENTS} tries; use smaller '
                       f'shapes (size_range)')


def render_relation(rng: np.random.Generator, size: int, label: str,
                    size_range: Sequence[float] = DEFAULT_SIZE_RANGE,
                    margin: float = DEFAULT_MARGIN_DEGREES
                    ) -> Tuple[np.ndarray, Dict[str, np.ndarray]]:
    """One image of class ``label``: (uint8 RGB (size, size, 3), masks),
    ``masks`` the painted pixels of the ``circle`` and the ``triangle``."""
    img = _background(rng, size, size)
    polygons = {kind: _polygon(kind, rng.uniform(*size_range) * size, rng)
                for kind in ('circle', 'triangle')}
    # the farthest vertex bounds each shape by a circle around its centre
    radius = {kind: float(np.hypot(*poly.T).max())
              for kind, poly in polygons.items()}
    centres = dict(zip(('circle', 'triangle'), _placement(
        rng, size, label, radius['circle'], radius['triangle'], margin)))
    masks = {}
    for kind, poly in polygons.items():
        poly = np.round(poly + centres[kind], 2)
        mask = _rasterize(poly, size, size)
        colour = _pick_colour(rng, img[mask].mean(0))
        # gentle shading across the shape, as in the other built-in sets
        angle = rng.uniform(0, 2 * math.pi)
        ys, xs = np.nonzero(mask)
        t = ((xs - centres[kind][0]) * math.cos(angle) +
             (ys - centres[kind][1]) * math.sin(angle)) / (2 * radius[kind])
        img[ys, xs] = colour + rng.uniform(10, 25) * t[:, None]
        masks[kind] = mask
    img += rng.normal(0, rng.uniform(2, 6), size=img.shape)  # fine grain
    return np.clip(np.rint(img), 0, 255).astype(np.uint8), masks


def _image(seed: int, split: int, index: int, size: int,
           size_range: Sequence[float], margin: float):
    rng = np.random.default_rng(np.random.SeedSequence(
        [int(seed), _SET_CODE, int(split), int(index)]))
    return render_relation(rng, size, CLASSES[index % len(CLASSES)],
                           size_range, margin)


def _check_params(num_train, num_val, image_size, size_range, margin):
    size, lo, hi = check_set_sizes(num_train, num_val, image_size,
                                   size_range, max_shape=0.4,
                                   why='two shapes must fit side by side')
    if not 0.0 <= float(margin) < 45.0:
        raise ValueError(f'margin {margin} must be in [0, 45) degrees')
    return dict(seed=None, num_train=int(num_train), num_val=int(num_val),
                image_size=size, size_range=[lo, hi],
                margin_degrees=float(margin))


def make_relation_set(root: str, num_train: int = DEFAULT_NUM_TRAIN,
                      num_val: int = DEFAULT_NUM_VAL,
                      image_size: int = DEFAULT_IMAGE_SIZE, seed: int = 0,
                      size_range: Sequence[float] = DEFAULT_SIZE_RANGE,
                      margin: float = DEFAULT_MARGIN_DEGREES,
                      reuse_existing: bool = True) -> dict:
    """Write the relation ImageFolder tree under ``root``.

    Returns a dict with ``root``, ``classes``, ``params``, per-split and
    per-class counts (``num_train``, ``num_val``, ``train_per_class``,
    ``val_per_class``), ``reused`` and ``seconds``.
    """
    start = time.perf_counter()
    params = _check_params(num_train, num_val, image_size, size_range,
                           margin)
    params['seed'] = int(seed)
    return write_balanced_image_folders(
        root, KIND, CLASSES, params, (num_train, num_val), reuse_existing,
        lambda split, index: _image(
            seed, split, index, params['image_size'], params['size_range'],
            params['margin_degrees'])[0], start)


def _mask_centre(mask: np.ndarray) -> np.ndarray:
    ys, xs = np.nonzero(mask)
    return np.array([xs.mean(), ys.mean()]) + 0.5


def check_labels(root: str) -> List[str]:
    """Problems with the labels of the relation set at ``root``: every
    image is drawn again from the manifest's parameters, and its folder is
    compared with the direction between the centres of the painted circle
    and triangle pixels. Returns one line per image filed under the wrong
    class, or whose pixels differ from the re-drawn ones (empty: all
    right)."""
    manifest = _read_manifest(root)
    if manifest is None or manifest.get('kind') != KIND:
        raise ValueError(f'{root} holds no relation set (no manifest.json '
                         f'of kind {KIND!r})')
    params = manifest['params']
    problems = []
    for split_index, split in enumerate(SPLITS):
        for folder in sorted(os.listdir(os.path.join(root, split))):
            for name in sorted(os.listdir(os.path.join(root, split,
                                                       folder))):
                match = _FILE_NAME.match(name)
                if not match or match.group(1) != split:
                    continue
                img, masks = _image(params['seed'], split_index,
                                    int(match.group(2)),
                                    params['image_size'],
                                    params['size_range'],
                                    params['margin_degrees'])
                path = os.path.join(root, split, folder, name)
                with open(path, 'rb') as f:
                    if f.read() != _jpeg_bytes(img):
                        problems.append(f'{split}/{folder}/{name}: not the '
                                        f'image drawn under this name')
                        continue
                dx, dy = (_mask_centre(masks['triangle'])
                          - _mask_centre(masks['circle']))
                painted = direction_class(dx, dy)
                if painted != folder:
                    problems.append(f'{split}/{folder}/{name}: the triangle '
                                    f'is {painted} the circle')
    return problems


def default_root(data_dir: str = 'data') -> str:
    """Where the tools put this set: ``<data_dir>/demo_rel``."""
    return os.path.join(data_dir, 'demo_rel')
