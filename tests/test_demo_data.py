"""The built-in demo datasets: determinism, COCO / ADE20K formats, labels
that match the drawn shapes, and loading with the real mmdet / mmseg
datasets."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from PIL import Image

from posmlp_dense.data import shapes as demo_data
from posmlp_dense.data.shapes import (DETECTION_CLASSES, SEGMENTATION_CLASSES,
                                    SEGMENTATION_PALETTE, make_demo_data,
                                    make_detection_set, make_segmentation_set)

SIZE = (96, 128)      # (H, W): small images keep the tests fast
N_TRAIN, N_VAL = 6, 4
# a rotated square fills at least 1 / (1 + sin 40deg) of its box, a circle
# pi / 4, a triangle about half
FILL_RATIO = {'circle': (0.70, 0.86), 'square': (0.58, 1.0),
              'triangle': (0.38, 0.62)}


def _files(root):
    """{relative path: bytes} of every file under root."""
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            with open(path, 'rb') as f:
                out[os.path.relpath(path, root)] = f.read()
    return out


def _load_json(path):
    with open(path, encoding='utf-8') as f:
        return json.load(f)


def _rgb(path):
    return np.asarray(Image.open(path).convert('RGB'), dtype=np.float64)


def _shift_or(mask, steps):
    """Dilate a boolean mask by ``steps`` pixels (4-neighbourhood)."""
    out = mask.copy()
    for _ in range(steps):
        grown = out.copy()
        grown[1:] |= out[:-1]
        grown[:-1] |= out[1:]
        grown[:, 1:] |= out[:, :-1]
        grown[:, :-1] |= out[:, 1:]
        out = grown
    return out


def _erode(mask, steps):
    return ~_shift_or(~mask, steps)


def _components(mask):
    """Connected components (4-neighbourhood) of a boolean mask, as a list
    of boolean masks (label propagation; the shapes here are small)."""
    h, w = mask.shape
    big = h * w + 1
    lab = np.where(mask, np.arange(h * w).reshape(h, w), big)
    while True:
        new = lab.copy()
        new[1:] = np.minimum(new[1:], lab[:-1])
        new[:-1] = np.minimum(new[:-1], lab[1:])
        new[:, 1:] = np.minimum(new[:, 1:], lab[:, :-1])
        new[:, :-1] = np.minimum(new[:, :-1], lab[:, 1:])
        new = np.where(mask, new, big)
        if np.array_equal(new, lab):
            break
        lab = new
    return [lab == v for v in np.unique(lab[mask])]


def _assert_is_drawn_shape(img, mask, kind):
    """The pixels of ``mask`` form a ``kind`` shape of one (shaded) colour
    that stands out from the pixels around it."""
    ys, xs = np.nonzero(mask)
    box_area = (np.ptp(xs) + 1) * (np.ptp(ys) + 1)
    lo, hi = FILL_RATIO[kind]
    assert lo <= mask.sum() / box_area <= hi, (kind, mask.sum() / box_area)
    inside = img[_erode(mask, 2)]
    ring = img[_shift_or(mask, 5) & ~_shift_or(mask, 2)]
    assert inside.std(0).max() < 16, inside.std(0)
    contrast = np.linalg.norm(inside.mean(0) - ring.mean(0))
    assert contrast > 60, contrast


@pytest.fixture(scope='module')
def det_root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('det') / 'demo_coco')
    make_detection_set(root, num_train=N_TRAIN, num_val=N_VAL,
                       image_size=SIZE, seed=3)
    return root


@pytest.fixture(scope='module')
def seg_root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('seg') / 'demo_ade')
    make_segmentation_set(root, num_train=N_TRAIN, num_val=N_VAL,
                          image_size=SIZE, seed=3)
    return root


# ---------------------------------------------------------------------------
# determinism, manifest
# ---------------------------------------------------------------------------


def test_same_seed_gives_identical_bytes(tmp_path):
    for name in ('a', 'b'):
        make_demo_data(str(tmp_path / name), seed=5, det_train=4, det_val=2,
                       seg_train=4, seg_val=2, image_size=SIZE,
                       verbose=False)
    a, b = _files(tmp_path / 'a'), _files(tmp_path / 'b')
    assert len(a) == 2 * 3 + 2 + 1 + 2 * (4 + 2) + 1
    assert a.keys() == b.keys()
    for rel in a:
        assert a[rel] == b[rel], rel


def test_other_seed_gives_other_data(tmp_path):
    make_demo_data(str(tmp_path / 'a'), seed=0, det_train=3, det_val=1,
                   seg_train=3, seg_val=1, image_size=SIZE, verbose=False)
    make_demo_data(str(tmp_path / 'b'), seed=1, det_train=3, det_val=1,
                   seg_train=3, seg_val=1, image_size=SIZE, verbose=False)
    a, b = _files(tmp_path / 'a'), _files(tmp_path / 'b')
    assert a.keys() == b.keys()
    for rel in a:
        if rel.endswith('.jpg'):
            assert a[rel] != b[rel], rel
    ann = 'demo_coco/annotations/instances_train.json'
    boxes = [[x['bbox'] for x in json.loads(s[ann])['annotations']]
             for s in (a, b)]
    assert boxes[0] != boxes[1]
    # the two sets of one seed differ from each other too
    assert (a['demo_coco/train/demo_train_00000.jpg'] !=
            a['demo_ade/images/training/demo_train_00000.jpg'])


def test_images_do_not_depend_on_the_set_size(tmp_path):
    make_detection_set(str(tmp_path / 'small'), num_train=2, num_val=1,
                       image_size=SIZE, seed=2)
    make_detection_set(str(tmp_path / 'big'), num_train=5, num_val=1,
                       image_size=SIZE, seed=2)
    for i in range(2):
        rel = os.path.join('train', f'demo_train_{i:05d}.jpg')
        with open(tmp_path / 'small' / rel, 'rb') as f1, \
                open(tmp_path / 'big' / rel, 'rb') as f2:
            assert f1.read() == f2.read()


def test_reuse_and_regeneration(tmp_path, capsys):
    root = str(tmp_path / 'data')
    kwargs = dict(det_train=4, det_val=2, seg_train=4, seg_val=2,
                  image_size=SIZE)
    first = make_demo_data(root, seed=0, **kwargs)
    assert not first['detection']['reused']
    assert not first['segmentation']['reused']
    capsys.readouterr()
    # a file the user put there, and one outside the owned folders
    foreign = tmp_path / 'data' / 'demo_ade' / 'images' / 'training' / 'x.jpg'
    foreign.write_bytes(b'not ours')
    outside = tmp_path / 'data' / 'keep.txt'
    outside.write_text('keep')

    again = make_demo_data(root, seed=0, **kwargs)
    assert again['detection']['reused'] and again['segmentation']['reused']
    assert again['detection']['num_train_instances'] == \
        first['detection']['num_train_instances']
    assert 'kept' in capsys.readouterr().out

    # a damaged file makes it regenerate
    img = tmp_path / 'data' / 'demo_coco' / 'val' / 'demo_val_00001.jpg'
    good = img.read_bytes()
    img.write_bytes(b'broken')
    fixed = make_demo_data(root, seed=0, **kwargs)
    assert not fixed['detection']['reused']
    assert fixed['segmentation']['reused']
    assert img.read_bytes() == good

    # other parameters: regenerated, stale images of the bigger set removed
    make_demo_data(root, seed=0, det_train=2, det_val=1, seg_train=2,
                   seg_val=1, image_size=SIZE)
    train = sorted(os.listdir(tmp_path / 'data' / 'demo_ade' / 'images' /
                              'training'))
    assert train == ['demo_train_00000.jpg', 'demo_train_00001.jpg', 'x.jpg']
    assert sorted(os.listdir(tmp_path / 'data' / 'demo_coco' / 'train')) == \
        ['demo_train_00000.jpg', 'demo_train_00001.jpg']
    assert outside.read_text() == 'keep' and foreign.read_bytes() == \
        b'not ours'
    manifest = _load_json(tmp_path / 'data' / 'demo_coco' / 'manifest.json')
    assert manifest['params']['num_train'] == 2
    assert demo_data.verify_manifest(str(tmp_path / 'data' / 'demo_coco'),
                                     'coco', manifest['params'])


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError):
        make_detection_set(str(tmp_path), image_size=(8, 8))
    with pytest.raises(ValueError):
        make_segmentation_set(str(tmp_path), shapes_per_image=(0, 2))


# ---------------------------------------------------------------------------
# detection set
# ---------------------------------------------------------------------------


def test_coco_layout_and_pycocotools(det_root):
    from pycocotools.coco import COCO
    for split, num in (('train', N_TRAIN), ('val', N_VAL)):
        coco = COCO(os.path.join(det_root, 'annotations',
                                 f'instances_{split}.json'))
        cats = coco.loadCats(coco.getCatIds())
        assert [(c['id'], c['name']) for c in cats] == \
            [(i + 1, n) for i, n in enumerate(DETECTION_CLASSES)]
        assert all('supercategory' in c for c in cats)
        imgs = coco.loadImgs(coco.getImgIds())
        assert len(imgs) == num
        for img in imgs:
            path = os.path.join(det_root, split, img['file_name'])
            with Image.open(path) as im:
                assert im.size == (img['width'], img['height'])
            assert (img['height'], img['width']) == SIZE
            anns = coco.loadAnns(coco.getAnnIds(imgIds=img['id']))
            assert 1 <= len(anns) <= 4
        ids = coco.getAnnIds()
        assert len(set(ids)) == len(ids)


def test_coco_boxes_polygons_areas(det_root):
    from pycocotools.coco import COCO
    coco = COCO(os.path.join(det_root, 'annotations', 'instances_train.json'))
    kinds = set()
    for ann in coco.loadAnns(coco.getAnnIds()):
        img = coco.loadImgs(ann['image_id'])[0]
        x, y, w, h = ann['bbox']
        assert ann['iscrowd'] == 0
        assert 0 <= x and 0 <= y and w > 0 and h > 0
        assert x + w <= img['width'] and y + h <= img['height']
        # the box is tight to the polygon (pixel-centre rasterization)
        poly = np.asarray(ann['segmentation'][0]).reshape(-1, 2)
        assert len(ann['segmentation']) == 1 and len(poly) >= 3
        assert np.all(np.abs([x - poly[:, 0].min(), y - poly[:, 1].min(),
                              x + w - poly[:, 0].max(),
                              y + h - poly[:, 1].max()]) <= 1.0)
        # and to the mask COCO's tools make from the polygon
        mask = coco.annToMask(ann).astype(bool)
        ys, xs = np.nonzero(mask)
        mask_box = [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]
        assert np.all(np.abs(np.subtract(mask_box, [x, y, x + w, y + h]))
                      <= 1)
        # the area is the drawn pixel count: equal to COCO's mask up to
        # pixels whose centre lies on the outline
        assert abs(mask.sum() - ann['area']) <= 0.03 * ann['area'] + 2
        kind = DETECTION_CLASSES[ann['category_id'] - 1]
        kinds.add(kind)
        image = _rgb(os.path.join(det_root, 'train', img['file_name']))
        _assert_is_drawn_shape(image, mask, kind)
    assert kinds == set(DETECTION_CLASSES)


def test_coco_annotations_equal_the_rendered_scene(det_root):
    """Exactly: the box is the bounding box of the painted pixels, the area
    their count, the polygon the one painted; the JPEG is the rendering."""
    data = _load_json(os.path.join(det_root, 'annotations',
                                   'instances_val.json'))
    for img in data['images']:
        index = img['id'] - 1
        rng = demo_data._image_rng(3, 'coco', 'val', index)
        image, shapes = demo_data.render_scene(rng, *SIZE)
        anns = [a for a in data['annotations'] if a['image_id'] == img['id']]
        assert len(anns) == len(shapes)
        for ann, shape in zip(anns, shapes):
            ys, xs = np.nonzero(shape['mask'])
            assert ann['bbox'] == [xs.min(), ys.min(), np.ptp(xs) + 1,
                                   np.ptp(ys) + 1]
            assert ann['area'] == shape['mask'].sum()
            assert ann['category_id'] == shape['label'] + 1
            assert np.allclose(ann['segmentation'][0],
                               shape['polygon'].reshape(-1))
        disk = _rgb(os.path.join(det_root, 'val', img['file_name']))
        assert np.abs(disk - image).mean() < 3.0
        # the shapes do not overlap
        total = np.sum([s['mask'] for s in shapes], axis=0)
        assert total.max() == 1


# ---------------------------------------------------------------------------
# segmentation set
# ---------------------------------------------------------------------------


def test_ade_layout_and_label_values(seg_root):
    seen = set()
    for split, folder, num in (('train', 'training', N_TRAIN),
                               ('val', 'validation', N_VAL)):
        imgs = sorted(os.listdir(os.path.join(seg_root, 'images', folder)))
        anns = sorted(os.listdir(os.path.join(seg_root, 'annotations',
                                              folder)))
        assert len(imgs) == num and all(n.endswith('.jpg') for n in imgs)
        assert [n[:-4] for n in anns] == [n[:-4] for n in imgs]
        for name in anns:
            with Image.open(os.path.join(seg_root, 'annotations', folder,
                                         name)) as im:
                assert im.mode == 'L' and im.size == SIZE[::-1]
                label = np.asarray(im)
            values = set(np.unique(label).tolist())
            assert values <= {1, 2, 3, 4}, values
            assert 1 in values and len(values) >= 2
            seen |= values
    assert seen == {1, 2, 3, 4}


def test_ade_labels_match_the_drawn_shapes(seg_root):
    checked = 0
    for i in range(N_VAL):
        stem = f'demo_val_{i:05d}'
        image = _rgb(os.path.join(seg_root, 'images', 'validation',
                                  stem + '.jpg'))
        label = np.asarray(Image.open(os.path.join(
            seg_root, 'annotations', 'validation', stem + '.png')))
        for value in (2, 3, 4):
            for comp in _components(label == value):
                _assert_is_drawn_shape(image, comp,
                                       SEGMENTATION_CLASSES[value - 1])
                checked += 1
        # the label map changes exactly where the image has edges
        for a, b, la, lb in ((image[:, :-1], image[:, 1:], label[:, :-1],
                              label[:, 1:]),
                             (image[:-1], image[1:], label[:-1], label[1:])):
            step = np.abs(a - b).sum(-1)
            cross = la != lb
            assert np.median(step[cross]) > 4 * np.median(step[~cross])
        # exact agreement with the rendering
        rng = demo_data._image_rng(3, 'ade', 'val', i)
        _, shapes = demo_data.render_scene(rng, *SIZE)
        expected = np.ones(SIZE, np.uint8)
        for shape in shapes:
            expected[shape['mask']] = shape['label'] + 2
        assert np.array_equal(label, expected)
    assert checked >= N_VAL


def test_constants():
    assert len(SEGMENTATION_PALETTE) == len(SEGMENTATION_CLASSES) == 4
    assert SEGMENTATION_CLASSES[0] == 'background'
    assert tuple(SEGMENTATION_CLASSES[1:]) == tuple(DETECTION_CLASSES)
    assert len(demo_data.DETECTION_PALETTE) == len(DETECTION_CLASSES)
    for colour in SEGMENTATION_PALETTE:
        assert len(colour) == 3 and all(0 <= c <= 255 for c in colour)


# ---------------------------------------------------------------------------
# the real frameworks
# ---------------------------------------------------------------------------


def test_mmdet_coco_dataset_loads_it(det_root):
    pytest.importorskip('mmdet')
    from mmdet.registry import DATASETS
    from mmdet.utils import register_all_modules
    register_all_modules()
    data = _load_json(os.path.join(det_root, 'annotations',
                                   'instances_train.json'))
    per_image = {}
    for ann in data['annotations']:
        per_image.setdefault(ann['image_id'], []).append(ann)
    dataset = DATASETS.build(dict(
        type='CocoDataset', data_root=det_root,
        ann_file='annotations/instances_train.json',
        data_prefix=dict(img='train/'),
        metainfo=dict(classes=DETECTION_CLASSES),
        filter_cfg=dict(filter_empty_gt=True, min_size=8),
        pipeline=[
            dict(type='LoadImageFromFile'),
            dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
            dict(type='PackDetInputs'),
        ]))
    assert len(dataset) == N_TRAIN
    assert dataset.metainfo['classes'] == DETECTION_CLASSES
    for i in range(len(dataset)):
        sample = dataset[i]
        ds = sample['data_samples']
        anns = per_image[ds.img_id]
        assert tuple(sample['inputs'].shape) == (3, *SIZE)
        gt = ds.gt_instances
        assert len(gt) == len(anns)
        assert gt.labels.tolist() == [a['category_id'] - 1 for a in anns]
        boxes = gt.bboxes.tensor.numpy()
        expected = [[a['bbox'][0], a['bbox'][1], a['bbox'][0] + a['bbox'][2],
                     a['bbox'][1] + a['bbox'][3]] for a in anns]
        assert np.allclose(boxes, expected)
        masks = gt.masks.to_ndarray()
        assert masks.shape == (len(anns), *SIZE)
        areas = masks.reshape(len(anns), -1).sum(1)
        assert np.allclose(areas, [a['area'] for a in anns], rtol=0.03,
                           atol=2)


def _seg_dataset(root, dataset_type, **kwargs):
    from mmseg.registry import DATASETS
    from mmseg.utils import register_all_modules
    register_all_modules()
    return DATASETS.build(dict(
        type=dataset_type, data_root=root,
        data_prefix=dict(img_path='images/validation',
                         seg_map_path='annotations/validation'),
        pipeline=[
            dict(type='LoadImageFromFile'),
            dict(type='LoadAnnotations', reduce_zero_label=True),
            dict(type='PackSegInputs'),
        ], **kwargs))


def _check_seg_samples(dataset, root):
    assert len(dataset) == N_VAL
    for i in range(len(dataset)):
        sample = dataset[i]
        ds = sample['data_samples']
        assert tuple(sample['inputs'].shape) == (3, *SIZE)
        seg = ds.gt_sem_seg.data.numpy()[0]
        name = os.path.basename(ds.seg_map_path)
        png = np.asarray(Image.open(os.path.join(
            root, 'annotations', 'validation', name)))
        # reduce_zero_label: value k -> class k - 1; 0 (unused) -> 255
        assert np.array_equal(seg, png.astype(np.int64) - 1)
        assert set(np.unique(seg).tolist()) <= {0, 1, 2, 3}


def test_mmseg_ade20k_dataset_reads_the_layout(seg_root):
    pytest.importorskip('mmseg')
    # ADE20KDataset fixes img_suffix='.jpg', seg_map_suffix='.png' and
    # reduce_zero_label=True; it only accepts ADE20K class names in
    # `metainfo`, so it is used here with its own
    dataset = _seg_dataset(seg_root, 'ADE20KDataset')
    assert dataset.reduce_zero_label
    _check_seg_samples(dataset, seg_root)


def test_mmseg_dataset_with_demo_classes(seg_root):
    pytest.importorskip('mmseg')
    # what a config that names the demo classes uses: the ADE20K settings on
    # BaseSegDataset, which takes any classes
    dataset = _seg_dataset(
        seg_root, 'BaseSegDataset', img_suffix='.jpg', seg_map_suffix='.png',
        reduce_zero_label=True,
        metainfo=dict(classes=SEGMENTATION_CLASSES,
                      palette=SEGMENTATION_PALETTE))
    assert tuple(dataset.metainfo['classes']) == SEGMENTATION_CLASSES
    assert [tuple(c) for c in dataset.metainfo['palette']] == \
        [tuple(c) for c in SEGMENTATION_PALETTE]
    _check_seg_samples(dataset, seg_root)
