"""The built-in relation set: deterministic, balanced, and labelled by where
the painted triangle is relative to the painted circle."""
from __future__ import annotations

import math
import os
import os.path as osp
import shutil

import numpy as np
import pytest
from PIL import Image

from posmlp_dense.data.relation_classes import (CLASSES, check_labels,
                                                direction_class,
                                                make_relation_set,
                                                render_relation)


def _files(root):
    return sorted(osp.relpath(osp.join(d, f), root)
                  for d, _, names in os.walk(root) for f in names
                  if f.endswith('.jpg'))


@pytest.fixture(scope='module')
def made(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('rel') / 'a')
    return root, make_relation_set(root, num_train=16, num_val=8,
                                   image_size=48, seed=3)


def test_same_seed_same_bytes_other_seed_other_images(made, tmp_path):
    root, _ = made
    again = str(tmp_path / 'b')
    make_relation_set(again, num_train=16, num_val=8, image_size=48, seed=3)
    assert _files(root) == _files(again) and len(_files(root)) == 24
    for rel in _files(root):
        assert open(osp.join(root, rel), 'rb').read() == \
            open(osp.join(again, rel), 'rb').read()
    other = str(tmp_path / 'c')
    make_relation_set(other, num_train=16, num_val=8, image_size=48, seed=4)
    differing = [rel for rel in _files(root)
                 if open(osp.join(root, rel), 'rb').read() !=
                 open(osp.join(other, rel), 'rb').read()]
    assert len(differing) == 24


def test_classes_are_balanced_folders(made):
    root, info = made
    assert info['train_per_class'] == [4, 4, 4, 4]
    assert info['val_per_class'] == [2, 2, 2, 2]
    for split, per_class in (('train', 4), ('val', 2)):
        assert sorted(os.listdir(osp.join(root, split))) == list(CLASSES)
        for name in CLASSES:
            assert len(os.listdir(osp.join(root, split, name))) == per_class


def test_labels_agree_with_the_painted_pixels(made):
    root, _ = made
    assert check_labels(root) == []


def test_a_planted_label_swap_is_caught(made, tmp_path):
    root, _ = made
    copy = str(tmp_path / 'swapped')
    shutil.copytree(root, copy)
    # file one 'left' image under 'right' and one 'right' image under 'left'
    left = sorted(os.listdir(osp.join(copy, 'train', 'left')))[0]
    right = sorted(os.listdir(osp.join(copy, 'train', 'right')))[0]
    shutil.move(osp.join(copy, 'train', 'left', left),
                osp.join(copy, 'train', 'right', left))
    shutil.move(osp.join(copy, 'train', 'right', right),
                osp.join(copy, 'train', 'left', right))
    problems = check_labels(copy)
    assert len(problems) == 2
    assert any(p.startswith(f'train/right/{left}: the triangle is left')
               for p in problems)
    # two images exchanging names (their folders' labels swapped)
    a = osp.join(copy, 'val', 'above', sorted(os.listdir(
        osp.join(copy, 'val', 'above')))[0])
    b = osp.join(copy, 'val', 'below', sorted(os.listdir(
        osp.join(copy, 'val', 'below')))[0])
    data_a, data_b = open(a, 'rb').read(), open(b, 'rb').read()
    open(a, 'wb').write(data_b)
    open(b, 'wb').write(data_a)
    assert len(check_labels(copy)) == 4


def _painted_direction(mask_triangle, mask_circle):
    """The test's own reading of the relation: the centroids of the painted
    pixels and the dominant axis of their offset."""
    ty, tx = np.nonzero(mask_triangle)
    cy, cx = np.nonzero(mask_circle)
    dx, dy = tx.mean() - cx.mean(), ty.mean() - cy.mean()
    if abs(dx) > abs(dy):
        return 'right' if dx > 0 else 'left'
    return 'below' if dy > 0 else 'above'


@pytest.mark.parametrize('label', CLASSES)
def test_rendered_scenes_show_their_class(label):
    for seed in range(10):
        rng = np.random.default_rng(seed)
        img, masks = render_relation(rng, 64, label)
        assert img.shape == (64, 64, 3) and img.dtype == np.uint8
        assert masks['circle'].sum() > 20 and masks['triangle'].sum() > 10
        assert not (masks['circle'] & masks['triangle']).any()
        assert _painted_direction(masks['triangle'], masks['circle']) == \
            label


def test_direction_class_sectors():
    assert direction_class(1, 0) == 'right'
    assert direction_class(-1, 0) == 'left'
    assert direction_class(0, 1) == 'below'  # image y grows downwards
    assert direction_class(0, -1) == 'above'
    angle = math.radians(44)
    assert direction_class(math.cos(angle), math.sin(angle)) == 'right'
    angle = math.radians(46)
    assert direction_class(math.cos(angle), math.sin(angle)) == 'below'


def test_images_are_readable_rgb(made):
    root, _ = made
    img = Image.open(osp.join(root, _files(root)[0]))
    assert img.mode == 'RGB' and img.size == (48, 48)


@pytest.mark.parametrize('kwargs, message', [
    (dict(image_size=16), 'too small'),
    (dict(num_train=-1), 'negative'),
    (dict(size_range=(0.3, 0.6)), 'size_range'),
    (dict(margin=45), 'margin'),
])
def test_bad_parameters_are_named(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_relation_set(str(tmp_path / 'x'), **kwargs)


def test_check_labels_refuses_a_folder_without_a_relation_set(tmp_path):
    with pytest.raises(ValueError, match='no relation set'):
        check_labels(str(tmp_path))


def test_make_demo_data_writes_and_keeps_the_relation_set(tmp_path, capsys):
    from conftest import load_tool
    tool = load_tool('make_demo_data')
    argv = ['--sets', 'rel', '--out', str(tmp_path), '--rel-train', '8',
            '--rel-val', '4', '--rel-size', '40']
    assert tool.main(argv) == 0
    assert 'relations:' in capsys.readouterr().out
    assert sorted(os.listdir(tmp_path / 'demo_rel' / 'train')) == \
        list(CLASSES)
    assert check_labels(str(tmp_path / 'demo_rel')) == []
    assert tool.main(argv) == 0
    assert 'kept the existing set' in capsys.readouterr().out
