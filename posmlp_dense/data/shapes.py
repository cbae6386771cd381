"""Built-in small datasets for the out-of-the-box demo.

Generates, deterministically from a seed and within seconds, two tiny sets of
real image files that the stock OpenMMLab datasets read:

* a COCO-format detection / instance-segmentation set
  (:func:`make_detection_set`)::

      <root>/annotations/instances_train.json
      <root>/annotations/instances_val.json
      <root>/train/demo_train_00000.jpg ...
      <root>/val/demo_val_00000.jpg ...
      <root>/manifest.json

  read by mmdet's ``CocoDataset`` with
  ``metainfo=dict(classes=DETECTION_CLASSES)``;

* an ADE20K-layout semantic-segmentation set
  (:func:`make_segmentation_set`)::

      <root>/images/training/demo_train_00000.jpg ...
      <root>/images/validation/demo_val_00000.jpg ...
      <root>/annotations/training/demo_train_00000.png ...
      <root>/annotations/validation/demo_val_00000.png ...
      <root>/manifest.json

  with ADE20K's label convention (``reduce_zero_label=True``): pixel value 0
  is unlabelled (never used here), value ``k >= 1`` is class ``k - 1`` of
  :data:`SEGMENTATION_CLASSES`.  mmseg's ``ADE20KDataset`` reads this layout,
  but refuses a ``metainfo`` whose classes are not ADE20K class names, so a
  config that names these classes uses ``BaseSegDataset`` with the same
  settings ADE20KDataset fixes: ``img_suffix='.jpg'``,
  ``seg_map_suffix='.png'``, ``reduce_zero_label=True`` and
  ``metainfo=dict(classes=SEGMENTATION_CLASSES,
  palette=SEGMENTATION_PALETTE)``.

Every image shows one to four filled shapes (circle, square, triangle) of a
colour chosen to contrast with a random textured background (smooth gradient,
stripes, low-frequency noise, fine grain).  Shapes never overlap, so the COCO
boxes, polygons and areas and the segmentation labels describe exactly what is
drawn: a shape is the set of pixels whose centre lies inside its stored
polygon.

The same seed and parameters give byte-identical files (for a given
numpy / Pillow build); another seed gives other data.  Each image is drawn from
its own random stream, derived from (seed, set, split, index), so adding images
does not change the existing ones.

:func:`make_demo_data` makes both sets under ``<root>/demo_coco`` and
``<root>/demo_ade`` and reuses a set whose ``manifest.json`` records the same
parameters and whose files still match the recorded hashes.

Only numpy, Pillow and the standard library are used.
"""
from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from PIL import Image

__all__ = ['DETECTION_CLASSES', 'DETECTION_PALETTE', 'SEGMENTATION_CLASSES',
           'SEGMENTATION_PALETTE', 'SHAPES', 'make_detection_set',
           'make_segmentation_set', 'make_demo_data', 'render_scene',
           'verify_manifest']

#: Shape kinds drawn in the images.
SHAPES: Tuple[str, ...] = ('circle', 'square', 'triangle')
#: Detection classes; COCO category ids are 1, 2, 3 in this order.
DETECTION_CLASSES: Tuple[str, ...] = SHAPES
#: Segmentation classes; label-map value ``i + 1`` is class ``i``.
SEGMENTATION_CLASSES: Tuple[str, ...] = ('background',) + SHAPES
#: One RGB colour per segmentation class (for visualisers).
SEGMENTATION_PALETTE: Tuple[Tuple[int, int, int], ...] = (
    (120, 120, 120), (220, 20, 60), (0, 130, 255), (255, 190, 0))
#: One RGB colour per detection class.
DETECTION_PALETTE: Tuple[Tuple[int, int, int], ...] = SEGMENTATION_PALETTE[1:]

FORMAT_VERSION = 1
DEFAULT_IMAGE_SIZE = (192, 256)   # (height, width)
#: Images of the demo sets' (train, val) splits. The detection demo's
#: validation split holds about 230 shapes, so that one box more or less
#: moves its share of right labels by under half a point.
DETECTION_SPLITS = (256, 96)
SEGMENTATION_SPLITS = (128, 32)
DEFAULT_SHAPES_PER_IMAGE = (1, 4)
DEFAULT_SIZE_RANGE = (0.2, 0.45)  # shape extent / shorter image side
JPEG_QUALITY = 95
SPLITS = ('train', 'val')
_SEG_SPLIT_DIRS = {'train': 'training', 'val': 'validation'}
_SET_CODES = {'coco': 0, 'ade': 1}
_GAP = 3            # minimum gap in pixels between the boxes of two shapes
_MIN_CONTRAST = 120.0  # minimum RGB distance of a shape to its background
_CIRCLE_VERTICES = 40
_OWN_FILE = re.compile(r'^demo_(train|val)_\d{5}\.(jpg|png)$')

# ---------------------------------------------------------------------------
# drawing
# ---------------------------------------------------------------------------


def _bilinear_upsample(grid: np.ndarray, height: int, width: int
                       ) -> np.ndarray:
    """Resize a small (gh, gw, c) grid to (height, width, c), bilinearly."""
    gh, gw = grid.shape[:2]
    ys = np.linspace(0, gh - 1, height)
    xs = np.linspace(0, gw - 1, width)
    y0 = np.clip(np.floor(ys).astype(int), 0, gh - 2)
    x0 = np.clip(np.floor(xs).astype(int), 0, gw - 2)
    fy = (ys - y0)[:, None, None]
    fx = (xs - x0)[None, :, None]
    g00 = grid[y0][:, x0]
    g01 = grid[y0][:, x0 + 1]
    g10 = grid[y0 + 1][:, x0]
    g11 = grid[y0 + 1][:, x0 + 1]
    top = g00 * (1 - fx) + g01 * fx
    bottom = g10 * (1 - fx) + g11 * fx
    return top * (1 - fy) + bottom * fy


def _background(rng: np.random.Generator, height: int, width: int
                ) -> np.ndarray:
    """A random textured background, float RGB in [0, 255], (H, W, 3)."""
    scale = float(max(height, width))
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float64) / scale
    # smooth gradient between two related colours
    c0 = rng.uniform(50, 205, size=3)
    c1 = np.clip(c0 + rng.uniform(-60, 60, size=3), 0, 255)
    angle = rng.uniform(0, 2 * math.pi)
    t = xx * math.cos(angle) + yy * math.sin(angle)
    t = (t - t.min()) / max(t.max() - t.min(), 1e-6)
    img = c0 + t[..., None] * (c1 - c0)
    # stripes
    if rng.random() < 0.7:
        angle = rng.uniform(0, math.pi)
        freq = rng.uniform(3, 12)            # periods across the image
        phase = rng.uniform(0, 2 * math.pi)
        amp = rng.uniform(8, 25)
        tint = rng.uniform(0.4, 1.0, size=3)
        wave = np.sin(2 * math.pi * freq *
                      (xx * math.cos(angle) + yy * math.sin(angle)) + phase)
        img += amp * wave[..., None] * tint
    # low-frequency colour noise
    if rng.random() < 0.8:
        gh, gw = int(rng.integers(3, 7)), int(rng.integers(4, 9))
        amp = rng.uniform(8, 25)
        grid = rng.normal(0, 1, size=(gh, gw, 3))
        img += amp * _bilinear_upsample(grid, height, width)
    return img


def _polygon(kind: str, extent: float, rng: np.random.Generator
             ) -> np.ndarray:
    """Vertices (N, 2) as (x, y) of a shape centred at the origin whose
    bounding box is roughly ``extent`` wide."""
    if kind == 'circle':
        start = rng.uniform(0, 2 * math.pi / _CIRCLE_VERTICES)
        a = start + np.arange(_CIRCLE_VERTICES) * (2 * math.pi /
                                                    _CIRCLE_VERTICES)
        pts = 0.5 * extent * np.stack([np.cos(a), np.sin(a)], axis=1)
    elif kind == 'square':
        rot = math.radians(rng.uniform(-20, 20))
        side = extent / (abs(math.cos(rot)) + abs(math.sin(rot)))
        a = rot + math.pi / 4 + np.arange(4) * (math.pi / 2)
        pts = side / math.sqrt(2) * np.stack([np.cos(a), np.sin(a)], axis=1)
    elif kind == 'triangle':
        # roughly equilateral, pointing up, slightly rotated
        rot = math.radians(rng.uniform(-15, 15))
        a = -math.pi / 2 + rot + np.arange(3) * (2 * math.pi / 3)
        pts = np.stack([np.cos(a), np.sin(a)], axis=1)
        pts *= extent / (pts.max(0) - pts.min(0)).max()
        pts[:, 1] *= rng.uniform(0.85, 1.1)
    else:
        raise ValueError(f'unknown shape {kind!r}')
    return pts - (pts.max(0) + pts.min(0)) / 2


def _rasterize(poly: np.ndarray, height: int, width: int) -> np.ndarray:
    """Boolean (H, W) mask of the pixels whose centre lies inside ``poly``
    (even-odd rule); the same convention as COCO's polygon rasterizer up to
    pixels on the boundary."""
    mask = np.zeros((height, width), dtype=bool)
    x0 = max(int(math.floor(poly[:, 0].min())), 0)
    x1 = min(int(math.ceil(poly[:, 0].max())), width)
    y0 = max(int(math.floor(poly[:, 1].min())), 0)
    y1 = min(int(math.ceil(poly[:, 1].max())), height)
    if x1 <= x0 or y1 <= y0:
        return mask
    px, py = np.meshgrid(np.arange(x0, x1) + 0.5, np.arange(y0, y1) + 0.5)
    inside = np.zeros(px.shape, dtype=bool)
    ax, ay = poly[:, 0], poly[:, 1]
    bx, by = np.roll(ax, -1), np.roll(ay, -1)
    for i in range(len(poly)):
        if ay[i] == by[i]:
            continue  # a horizontal edge is never crossed
        crosses = (ay[i] > py) != (by[i] > py)
        x_cross = ax[i] + (py - ay[i]) * (bx[i] - ax[i]) / (by[i] - ay[i])
        inside ^= crosses & (px < x_cross)
    mask[y0:y1, x0:x1] = inside
    return mask


def _pick_colour(rng: np.random.Generator, reference: np.ndarray
                 ) -> np.ndarray:
    """A saturated-ish colour far from ``reference`` (RGB) in RGB space."""
    best, best_dist = None, -1.0
    for _ in range(24):
        colour = rng.uniform(0, 255, size=3)
        # push one channel to an extreme for a vivid colour
        colour[rng.integers(3)] = rng.choice([rng.uniform(0, 40),
                                              rng.uniform(215, 255)])
        dist = float(np.linalg.norm(colour - reference))
        if dist >= _MIN_CONTRAST:
            return colour
        if dist > best_dist:
            best, best_dist = colour, dist
    # fall back to the far corner of the RGB cube
    if best_dist < 0.75 * _MIN_CONTRAST:
        best = np.where(reference > 127.5, 0.0, 255.0)
    return best


def render_scene(rng: np.random.Generator, height: int, width: int,
                 shapes_per_image: Sequence[int] = DEFAULT_SHAPES_PER_IMAGE,
                 size_range: Sequence[float] = DEFAULT_SIZE_RANGE
                 ) -> Tuple[np.ndarray, List[dict]]:
    """Draw one image.

    Returns ``(image, shapes)``: a uint8 RGB array (H, W, 3) and one dict per
    drawn shape with ``kind`` (a name in :data:`SHAPES`), ``label`` (its index
    in :data:`SHAPES`), ``polygon`` (N, 2) float array of (x, y) vertices in
    pixel coordinates (pixel ``(i, j)`` covers ``[j, j+1) x [i, i+1)``),
    ``mask`` (bool H x W: the pixels whose centre lies inside the polygon,
    exactly the pixels painted) and ``colour`` (the fill colour, RGB).
    """
    img = _background(rng, height, width)
    short = min(height, width)
    lo, hi = shapes_per_image
    wanted = int(rng.integers(lo, hi + 1))
    boxes: List[Tuple[float, float, float, float]] = []
    shapes: List[dict] = []
    for _ in range(wanted):
        for _attempt in range(30):
            label = int(rng.integers(len(SHAPES)))
            kind = SHAPES[label]
            extent = rng.uniform(*size_range) * short
            poly = _polygon(kind, extent, rng)
            w_half = -poly[:, 0].min(), poly[:, 0].max()
            h_half = -poly[:, 1].min(), poly[:, 1].max()
            cx = rng.uniform(w_half[0] + 1, width - w_half[1] - 1)
            cy = rng.uniform(h_half[0] + 1, height - h_half[1] - 1)
            poly = np.round(poly + [cx, cy], 2)
            box = (poly[:, 0].min() - _GAP, poly[:, 1].min() - _GAP,
                   poly[:, 0].max() + _GAP, poly[:, 1].max() + _GAP)
            if any(box[0] < b[2] and b[0] < box[2] and
                   box[1] < b[3] and b[1] < box[3] for b in boxes):
                continue
            mask = _rasterize(poly, height, width)
            if mask.sum() < 16:
                continue
            boxes.append(box)
            colour = _pick_colour(rng, img[mask].mean(0))
            # gentle shading across the shape
            angle = rng.uniform(0, 2 * math.pi)
            ys, xs = np.nonzero(mask)
            t = ((xs - cx) * math.cos(angle) + (ys - cy) * math.sin(angle))
            t = t / max(extent, 1.0)
            img[ys, xs] = colour + rng.uniform(10, 25) * t[:, None]
            shapes.append(dict(kind=kind, label=label, polygon=poly,
                               mask=mask, colour=colour))
            break
    # fine grain over everything
    img += rng.normal(0, rng.uniform(2, 6), size=img.shape)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8), shapes


def _image_rng(seed: int, set_name: str, split: str, index: int
               ) -> np.random.Generator:
    entropy = [int(seed), _SET_CODES[set_name], SPLITS.index(split),
               int(index)]
    return np.random.default_rng(np.random.SeedSequence(entropy))


def _jpeg_bytes(img: np.ndarray) -> bytes:
    buf = io.BytesIO()
    # fixed quality and 4:4:4 chroma; no metadata, so the bytes depend only
    # on the pixels (and the libjpeg build)
    Image.fromarray(img, 'RGB').save(buf, format='JPEG',
                                     quality=JPEG_QUALITY, subsampling=0,
                                     optimize=False)
    return buf.getvalue()


def _png_bytes(label: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(label, 'L').save(buf, format='PNG', compress_level=6)
    return buf.getvalue()


def _json_bytes(obj) -> bytes:
    return (json.dumps(obj, separators=(',', ':')) + '\n').encode('utf-8')


# ---------------------------------------------------------------------------
# files, manifest
# ---------------------------------------------------------------------------


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_sha256(path: str) -> str:
    with open(path, 'rb') as f:
        return _sha256(f.read())


def _content_hash(files: Dict[str, str]) -> str:
    h = hashlib.sha256()
    for rel in sorted(files):
        h.update(f'{rel}\0{files[rel]}\n'.encode('utf-8'))
    return h.hexdigest()


def _manifest_path(root: str) -> str:
    return os.path.join(root, 'manifest.json')


def _read_manifest(root: str) -> Optional[dict]:
    try:
        with open(_manifest_path(root), encoding='utf-8') as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def verify_manifest(root: str, kind: Optional[str] = None,
                    params: Optional[dict] = None) -> bool:
    """Whether ``root`` holds a complete set generated with ``params``: its
    ``manifest.json`` names the same kind, format version and parameters, and
    every file it lists is there with the recorded SHA-256."""
    manifest = _read_manifest(root)
    if manifest is None:
        return False
    if manifest.get('format_version') != FORMAT_VERSION:
        return False
    if kind is not None and manifest.get('kind') != kind:
        return False
    if params is not None and manifest.get('params') != _jsonable(params):
        return False
    files = manifest.get('files')
    if not isinstance(files, dict) or not files:
        return False
    if manifest.get('content_hash') != _content_hash(files):
        return False
    for rel, digest in files.items():
        path = os.path.join(root, *rel.split('/'))
        if not os.path.isfile(path) or _file_sha256(path) != digest:
            return False
    return True


def _jsonable(obj):
    """Round-trip through JSON so tuples compare equal to lists."""
    return json.loads(json.dumps(obj))


class _Writer:
    """Writes the files of one set and records their hashes.

    Before writing it removes the previous manifest (so an interrupted run
    never looks complete) and, at the end, only files of its own naming
    pattern (``demo_<split>_<5 digits>.jpg|png``) in its own sub-folders that
    the new set does not contain, so stale images of a bigger earlier set do
    not linger where a dataset lists a folder.  Nothing else is deleted.
    """

    def __init__(self, root: str, subdirs: Sequence[str]):
        self.root = root
        self.subdirs = list(subdirs)
        self.files: Dict[str, str] = {}
        os.makedirs(root, exist_ok=True)
        if os.path.isfile(_manifest_path(root)):
            os.remove(_manifest_path(root))
        for sub in self.subdirs:
            os.makedirs(os.path.join(root, *sub.split('/')), exist_ok=True)

    def write(self, rel: str, data: bytes) -> str:
        path = os.path.join(self.root, *rel.split('/'))
        with open(path, 'wb') as f:
            f.write(data)
        self.files[rel] = _sha256(data)
        return path

    def finish(self, kind: str, params: dict, counts: dict) -> dict:
        for sub in self.subdirs:
            folder = os.path.join(self.root, *sub.split('/'))
            for name in sorted(os.listdir(folder)):
                rel = f'{sub}/{name}'
                if _OWN_FILE.match(name) and rel not in self.files and \
                        os.path.isfile(os.path.join(folder, name)):
                    os.remove(os.path.join(folder, name))
        manifest = dict(generator='posmlp_dense.data.shapes',
                        format_version=FORMAT_VERSION, kind=kind,
                        params=_jsonable(params), counts=counts,
                        content_hash=_content_hash(self.files),
                        files=dict(sorted(self.files.items())))
        with open(_manifest_path(self.root), 'wb') as f:
            f.write((json.dumps(manifest, indent=1) + '\n').encode('utf-8'))
        return manifest


def _check_args(num_train, num_val, image_size, shapes_per_image,
                size_range):
    height, width = (int(v) for v in image_size)
    if height < 32 or width < 32:
        raise ValueError(f'image_size {image_size} is too small (min 32)')
    if int(num_train) < 0 or int(num_val) < 0:
        raise ValueError('image counts must not be negative')
    lo, hi = (int(v) for v in shapes_per_image)
    if not 1 <= lo <= hi:
        raise ValueError(f'bad shapes_per_image {shapes_per_image}')
    smin, smax = (float(v) for v in size_range)
    if not 0.05 <= smin <= smax <= 0.9:
        raise ValueError(f'bad size_range {size_range}')
    return height, width


def _params(seed, num_train, num_val, height, width, shapes_per_image,
            size_range):
    return dict(seed=int(seed), num_train=int(num_train),
                num_val=int(num_val), image_size=[height, width],
                shapes_per_image=[int(v) for v in shapes_per_image],
                size_range=[float(v) for v in size_range],
                jpeg_quality=JPEG_QUALITY)


# ---------------------------------------------------------------------------
# public API
# ---------------------------------------------------------------------------


def make_detection_set(root: str, num_train: int = DETECTION_SPLITS[0],
                       num_val: int = DETECTION_SPLITS[1],
                       image_size: Sequence[int] = DEFAULT_IMAGE_SIZE,
                       seed: int = 0,
                       shapes_per_image: Sequence[int] =
                       DEFAULT_SHAPES_PER_IMAGE,
                       size_range: Sequence[float] = DEFAULT_SIZE_RANGE,
                       reuse_existing: bool = False) -> dict:
    """Write a COCO-format shapes set under ``root``.

    Layout: ``annotations/instances_{train,val}.json``, images in ``train/``
    and ``val/`` (``demo_<split>_<index>.jpg``) and ``manifest.json``.
    Categories ``circle``, ``square``, ``triangle`` have ids 1, 2, 3.  Each
    annotation has a ``bbox`` [x, y, w, h] tight to the drawn pixels, their
    count as ``area``, the shape's polygon as ``segmentation``, ``iscrowd``
    0, ``category_id``, ``image_id`` and ``id``.

    ``image_size`` is (height, width).  With ``reuse_existing`` an existing
    set made with the same parameters (and intact files) is kept as it is.

    Returns a dict with ``root``, ``data_root``-relative paths
    (``train_ann``, ``val_ann``, ``train_img_dir``, ``val_img_dir``), the
    image and instance counts, ``classes``, ``params``, ``reused`` and
    ``seconds``.
    """
    start = time.perf_counter()
    height, width = _check_args(num_train, num_val, image_size,
                                shapes_per_image, size_range)
    params = _params(seed, num_train, num_val, height, width,
                     shapes_per_image, size_range)
    info = dict(root=root, train_ann='annotations/instances_train.json',
                val_ann='annotations/instances_val.json',
                train_img_dir='train/', val_img_dir='val/',
                classes=DETECTION_CLASSES, params=params)
    if reuse_existing and verify_manifest(root, 'coco', params):
        counts = _read_manifest(root).get('counts', {})
        info.update(counts, reused=True,
                    seconds=time.perf_counter() - start)
        return info

    writer = _Writer(root, ['annotations', 'train', 'val'])
    categories = [dict(id=i + 1, name=name, supercategory='shape')
                  for i, name in enumerate(DETECTION_CLASSES)]
    counts = {}
    for split, num in (('train', num_train), ('val', num_val)):
        images, annotations = [], []
        for index in range(int(num)):
            rng = _image_rng(seed, 'coco', split, index)
            img, shapes = render_scene(rng, height, width, shapes_per_image,
                                       size_range)
            name = f'demo_{split}_{index:05d}.jpg'
            writer.write(f'{split}/{name}', _jpeg_bytes(img))
            image_id = index + 1
            images.append(dict(id=image_id, file_name=name, height=height,
                               width=width))
            for shape in shapes:
                ys, xs = np.nonzero(shape['mask'])
                x0, x1 = int(xs.min()), int(xs.max()) + 1
                y0, y1 = int(ys.min()), int(ys.max()) + 1
                annotations.append(dict(
                    id=len(annotations) + 1, image_id=image_id,
                    category_id=shape['label'] + 1,
                    bbox=[float(x0), float(y0), float(x1 - x0),
                          float(y1 - y0)],
                    area=float(len(xs)),
                    segmentation=[[float(v) for v in
                                   shape['polygon'].reshape(-1)]],
                    iscrowd=0))
        coco = dict(
            info=dict(description='posmlp-dense built-in demo shapes '
                      f'({split})', version=str(FORMAT_VERSION),
                      seed=int(seed)),
            licenses=[], images=images, annotations=annotations,
            categories=categories)
        writer.write(f'annotations/instances_{split}.json', _json_bytes(coco))
        counts[f'num_{split}'] = len(images)
        counts[f'num_{split}_instances'] = len(annotations)
    writer.finish('coco', params, counts)
    info.update(counts, reused=False, seconds=time.perf_counter() - start)
    return info


def make_segmentation_set(root: str, num_train: int = 128,
                          num_val: int = 32,
                          image_size: Sequence[int] = DEFAULT_IMAGE_SIZE,
                          seed: int = 0,
                          shapes_per_image: Sequence[int] =
                          DEFAULT_SHAPES_PER_IMAGE,
                          size_range: Sequence[float] = DEFAULT_SIZE_RANGE,
                          reuse_existing: bool = False) -> dict:
    """Write an ADE20K-layout shapes set under ``root``.

    Layout: ``images/{training,validation}/demo_<split>_<index>.jpg``,
    ``annotations/{training,validation}/demo_<split>_<index>.png`` (8-bit
    grey) and ``manifest.json``.  Label values: 1 ``background``, 2
    ``circle``, 3 ``square``, 4 ``triangle`` (0, unlabelled, is not used);
    read with ``reduce_zero_label=True`` they become the indices of
    :data:`SEGMENTATION_CLASSES`.

    ``image_size`` is (height, width).  With ``reuse_existing`` an existing
    set made with the same parameters (and intact files) is kept as it is.

    Returns a dict with ``root``, ``data_root``-relative folders
    (``train_img_dir``, ``train_ann_dir``, ``val_img_dir``, ``val_ann_dir``),
    counts, ``classes``, ``palette``, ``params``, ``reused`` and ``seconds``.
    """
    start = time.perf_counter()
    height, width = _check_args(num_train, num_val, image_size,
                                shapes_per_image, size_range)
    params = _params(seed, num_train, num_val, height, width,
                     shapes_per_image, size_range)
    info = dict(root=root, train_img_dir='images/training',
                train_ann_dir='annotations/training',
                val_img_dir='images/validation',
                val_ann_dir='annotations/validation',
                classes=SEGMENTATION_CLASSES, palette=SEGMENTATION_PALETTE,
                params=params)
    if reuse_existing and verify_manifest(root, 'ade', params):
        counts = _read_manifest(root).get('counts', {})
        info.update(counts, reused=True,
                    seconds=time.perf_counter() - start)
        return info

    subdirs = [f'{top}/{_SEG_SPLIT_DIRS[s]}'
               for top in ('images', 'annotations') for s in SPLITS]
    writer = _Writer(root, subdirs)
    counts = {}
    for split, num in (('train', num_train), ('val', num_val)):
        folder = _SEG_SPLIT_DIRS[split]
        pixels = np.zeros(len(SEGMENTATION_CLASSES), dtype=np.int64)
        for index in range(int(num)):
            rng = _image_rng(seed, 'ade', split, index)
            img, shapes = render_scene(rng, height, width, shapes_per_image,
                                       size_range)
            label = np.ones((height, width), dtype=np.uint8)
            for shape in shapes:
                label[shape['mask']] = shape['label'] + 2
            pixels += np.bincount(label.reshape(-1) - 1,
                                  minlength=len(pixels))
            stem = f'demo_{split}_{index:05d}'
            writer.write(f'images/{folder}/{stem}.jpg', _jpeg_bytes(img))
            writer.write(f'annotations/{folder}/{stem}.png',
                         _png_bytes(label))
        counts[f'num_{split}'] = int(num)
        counts[f'{split}_class_pixels'] = [int(v) for v in pixels]
    writer.finish('ade', params, counts)
    info.update(counts, reused=False, seconds=time.perf_counter() - start)
    return info


def make_demo_data(root: str = 'data', seed: int = 0,
                   det_train: int = DETECTION_SPLITS[0],
                   det_val: int = DETECTION_SPLITS[1],
                   seg_train: int = SEGMENTATION_SPLITS[0],
                   seg_val: int = SEGMENTATION_SPLITS[1],
                   image_size: Sequence[int] = DEFAULT_IMAGE_SIZE,
                   force: bool = False, verbose: bool = True) -> dict:
    """Make both demo sets: ``<root>/demo_coco`` and ``<root>/demo_ade``.

    A set already there with the same seed and parameters and intact files
    is kept (and reported as such) unless ``force``; a set made with other
    parameters is regenerated in place.  Nothing outside those two folders
    is touched.  Returns ``dict(detection=..., segmentation=...)`` with the
    dicts of :func:`make_detection_set` and :func:`make_segmentation_set`.
    """
    det = make_detection_set(os.path.join(root, 'demo_coco'),
                             num_train=det_train, num_val=det_val,
                             image_size=image_size, seed=seed,
                             reuse_existing=not force)
    if verbose:
        _report('detection', det)
    seg = make_segmentation_set(os.path.join(root, 'demo_ade'),
                                num_train=seg_train, num_val=seg_val,
                                image_size=image_size, seed=seed,
                                reuse_existing=not force)
    if verbose:
        _report('segmentation', seg)
    return dict(detection=det, segmentation=seg)


def _report(what: str, info: dict) -> None:
    h, w = info['params']['image_size']
    seed = info['params']['seed']
    if info['reused']:
        print(f'{what}: {info["root"]} already holds this set (seed {seed}, '
              f'{info.get("num_train")}+{info.get("num_val")} images of '
              f'{h}x{w}); kept it')
        return
    extra = ''
    if 'num_train_instances' in info:
        extra = (f', {info["num_train_instances"]}+'
                 f'{info["num_val_instances"]} instances')
    print(f'{what}: wrote {info["root"]} (seed {seed}, {info["num_train"]} '
          f'train + {info["num_val"]} val images of {h}x{w}{extra}) in '
          f'{info["seconds"]:.2f} s')
