"""A built-in image-classification set: one shape per image, as an ImageFolder.

Pretraining a backbone (``tools/pretrain.py``) needs an ImageNet-style tree;
this writes a small one, deterministically from a seed and within seconds,
drawn like the detection/segmentation demo sets (:mod:`.shapes`: a shape on a
random textured background), so a backbone pretrained on it transfers to the
demo detector::

    <root>/train/circle/demo_train_00000.jpg ...
    <root>/train/square/...
    <root>/train/triangle/...
    <root>/val/circle/demo_val_00000.jpg ...
    <root>/manifest.json

Image ``i`` of a split shows class ``i % 3`` (in :data:`CLASSES` order), so
the classes are exactly balanced when a split's size is a multiple of three
(chance top-1 is then 1/3). Every image is drawn from its own random stream,
derived from (seed, split, index), so adding images does not change the
existing ones, and the same seed and parameters give byte-identical files.
A set already there with the same parameters and intact files is kept.
"""
from __future__ import annotations

import os
import time
from typing import Sequence, Tuple

import numpy as np

from .shapes import (SHAPES, _Writer, _jpeg_bytes, _read_manifest,
                     render_scene, verify_manifest)

__all__ = ['CLASSES', 'make_classification_set',
           'write_balanced_image_folders']

#: Class names; the ImageFolder reader sorts them, which keeps this order.
CLASSES = tuple(sorted(SHAPES))
KIND = 'classes'
DEFAULT_IMAGE_SIZE = 64
# Shape extent relative to the image side: 29-51 pixels at 64 x 64, about
# the size of the detection set's shapes (38-86 pixels); a shape fills much
# of its image, which a small model learns to classify in minutes.
DEFAULT_SIZE_RANGE = (0.45, 0.8)
SPLITS = ('train', 'val')
_SET_CODE = 2  # 0 and 1 are the detection and segmentation sets' streams
_MAX_DRAWS = 200


def _draw(seed: int, split: int, index: int, size: int,
          size_range: Sequence[float]) -> np.ndarray:
    """Image ``index`` of a split: one shape of class ``index % 3``.

    render_scene picks the kind itself, so streams are drawn in turn
    (attempt 0, 1, ...) until one shows the wanted kind: about three tries.
    """
    wanted = CLASSES[index % len(CLASSES)]
    for attempt in range(_MAX_DRAWS):
        rng = np.random.default_rng(np.random.SeedSequence(
            [int(seed), _SET_CODE, split, int(index), attempt]))
        img, shapes = render_scene(rng, size, size, shapes_per_image=(1, 1),
                                   size_range=size_range)
        if len(shapes) == 1 and shapes[0]['kind'] == wanted:
            return img
    raise RuntimeError(f'no {wanted} drawn for image {index} in '
                       f'{_MAX_DRAWS} tries')  # probability ~ (2/3)**200


def check_set_sizes(num_train, num_val, image_size, size_range,
                    max_shape: float, why: str = '') -> Tuple[int, float, float]:
    """(image size, smallest and largest shape fraction) of a built-in
    classification set, checked: images of at least 32 pixels, no negative
    count, 0.05 <= min <= max <= ``max_shape`` (``why``: the reason for
    that bound, added to its error)."""
    size = int(image_size)
    if size < 32:
        raise ValueError(f'image_size {image_size} is too small (min 32)')
    if int(num_train) < 0 or int(num_val) < 0:
        raise ValueError('image counts must not be negative')
    lo, hi = (float(v) for v in size_range)
    if not 0.05 <= lo <= hi <= max_shape:
        raise ValueError(f'bad size_range {size_range}: need '
                         f'0.05 <= min <= max <= {max_shape:g}'
                         + (f' ({why})' if why else ''))
    return size, lo, hi


def make_classification_set(root: str, num_train: int = 900,
                            num_val: int = 150,
                            image_size: int = DEFAULT_IMAGE_SIZE,
                            seed: int = 0,
                            size_range: Sequence[float] = DEFAULT_SIZE_RANGE,
                            reuse_existing: bool = True) -> dict:
    """Write the shape-classification ImageFolder tree under ``root``.

    Returns a dict with ``root``, ``classes``, ``params``, per-split and
    per-class counts (``num_train``, ``num_val``, ``train_per_class``,
    ``val_per_class``), ``reused`` and ``seconds``.
    """
    start = time.perf_counter()
    size, lo, hi = check_set_sizes(num_train, num_val, image_size,
                                   size_range, max_shape=0.9)
    params = dict(seed=int(seed), num_train=int(num_train),
                  num_val=int(num_val), image_size=size,
                  size_range=[lo, hi])
    return write_balanced_image_folders(
        root, KIND, CLASSES, params, (num_train, num_val), reuse_existing,
        lambda split, index: _draw(seed, split, index, size, (lo, hi)), start)


def write_balanced_image_folders(root: str, kind: str, classes, params: dict,
                                 sizes, reuse_existing: bool, draw,
                                 start: float) -> dict:
    """The ImageFolder tree of a built-in classification set: image
    ``index`` of split ``s`` (0 train, 1 val; ``sizes`` images each) is
    ``draw(s, index)``, of class ``index % len(classes)``, written as
    ``<split>/<class>/demo_<split>_<index>.jpg`` with the manifest of
    ``kind`` and ``params``; a set already there with the same parameters
    and intact files is kept (``reuse_existing``). Returns ``root``,
    ``classes``, ``params``, the per-split and per-class counts,
    ``reused`` and ``seconds`` since ``start``."""
    info = dict(root=root, classes=classes, params=params)
    if reuse_existing and verify_manifest(root, kind, params):
        info.update(_read_manifest(root).get('counts', {}), reused=True,
                    seconds=time.perf_counter() - start)
        return info
    writer = _Writer(root, [f'{split}/{name}' for split in SPLITS
                            for name in classes])
    counts = {}
    for split_index, (split, num) in enumerate(zip(SPLITS, sizes)):
        per_class = [0] * len(classes)
        for index in range(int(num)):
            img = draw(split_index, index)
            label = index % len(classes)
            per_class[label] += 1
            writer.write(f'{split}/{classes[label]}/demo_{split}_'
                         f'{index:05d}.jpg', _jpeg_bytes(img))
        counts[f'num_{split}'] = int(num)
        counts[f'{split}_per_class'] = per_class
    writer.finish(kind, params, counts)
    info.update(counts, reused=False, seconds=time.perf_counter() - start)
    return info


def default_root(data_dir: str = 'data') -> str:
    """Where the demo tools put this set: ``<data_dir>/demo_cls``."""
    return os.path.join(data_dir, 'demo_cls')
