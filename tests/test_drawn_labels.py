"""posmlp_dense.analysis.drawn_labels on hand-made boxes."""
from __future__ import annotations

import pytest

from posmlp_dense.analysis.drawn_labels import box_iou, drawn_label_share

CATEGORIES = [dict(id=1, name='circle'), dict(id=2, name='square'),
              dict(id=3, name='triangle')]


def _gt():
    # image 1: a circle and a square; image 2: a triangle
    anns = [dict(id=1, image_id=1, category_id=1, bbox=[10, 10, 40, 40]),
            dict(id=2, image_id=1, category_id=2, bbox=[100, 20, 50, 50]),
            dict(id=3, image_id=2, category_id=3, bbox=[30, 30, 60, 40])]
    return dict(images=[dict(id=1), dict(id=2)], annotations=anns,
                categories=CATEGORIES)


def _pred(image, cat, box, score):
    return dict(image_id=image, category_id=cat, bbox=box, score=score)


def test_iou_of_hand_made_boxes():
    assert box_iou([0, 0, 10, 10], [0, 0, 10, 10]) == 1.0
    assert box_iou([0, 0, 10, 10], [5, 0, 10, 10]) == pytest.approx(50 / 150)
    assert box_iou([0, 0, 10, 10], [10, 0, 10, 10]) == 0.0  # touching


def test_all_right():
    preds = [_pred(1, 1, [11, 10, 40, 40], 0.9),
             _pred(1, 2, [100, 22, 50, 50], 0.8),
             _pred(2, 3, [30, 30, 58, 40], 0.7)]
    out = drawn_label_share(_gt(), preds)
    assert (out['drawn'], out['right'], out['share']) == (3, 3, 1.0)
    assert out['missed'] == 0
    assert out['confusion']['square'] == dict(circle=0, square=1,
                                              triangle=0)


def test_planted_wrong_label_is_caught_and_lands_in_the_confusion():
    preds = [_pred(1, 1, [11, 10, 40, 40], 0.9),
             _pred(1, 3, [100, 22, 50, 50], 0.8),  # a square called triangle
             _pred(2, 3, [30, 30, 58, 40], 0.7)]
    out = drawn_label_share(_gt(), preds)
    assert out['right'] == 2 and out['wrong_class'] == 1
    assert out['share'] == pytest.approx(2 / 3)
    assert out['confusion']['square']['triangle'] == 1
    assert out['missed'] == 1
    assert out['per_image'][1] == dict(right=1, wrong_class=1, duplicate=0,
                                       background=0)


def test_below_the_score_threshold_is_not_drawn():
    preds = [_pred(1, 1, [11, 10, 40, 40], 0.9),
             _pred(1, 3, [100, 22, 50, 50], 0.49)]  # wrong, but not drawn
    out = drawn_label_share(_gt(), preds)
    assert (out['drawn'], out['right'], out['share']) == (1, 1, 1.0)
    assert out['outcomes'] == ['right', None]
    assert drawn_label_share(_gt(), preds, score_thr=0.4)['share'] == 0.5


def test_duplicates_background_and_loose_boxes():
    preds = [_pred(1, 1, [10, 10, 40, 40], 0.9),
             _pred(1, 1, [12, 10, 40, 40], 0.8),   # same circle again
             _pred(1, 2, [200, 150, 20, 20], 0.7),  # nothing there
             _pred(2, 3, [30, 30, 20, 20], 0.6)]   # right class, IoU 1/6
    out = drawn_label_share(_gt(), preds)
    assert out['right'] == 1 and out['duplicate'] == 1
    assert out['background'] == 2 and out['share'] == 0.25
    # the IoU threshold decides about the loose triangle box
    assert drawn_label_share(_gt(), preds, iou_thr=0.15)['right'] == 2


def test_the_higher_score_takes_the_ground_truth_box():
    preds = [_pred(1, 1, [20, 20, 40, 40], 0.6),   # IoU 0.39 with the circle
             _pred(1, 1, [10, 10, 40, 40], 0.95)]
    out = drawn_label_share(_gt(), preds, iou_thr=0.3)
    assert out['outcomes'] == ['duplicate', 'right']


def test_nothing_drawn_has_no_share():
    out = drawn_label_share(_gt(), [])
    assert out['drawn'] == 0 and out['share'] is None
    assert out['missed'] == out['num_gt'] == 3


@pytest.mark.parametrize('pred, message', [
    (dict(image_id=1, category_id=1, bbox=[0, 0, 1, 1]), 'score'),
    (_pred(9, 1, [0, 0, 1, 1], 0.9), 'image 9'),
    (_pred(1, 7, [0, 0, 1, 1], 0.9), 'category 7'),
    (_pred(1, 1, [0, 0, 1], 0.9), 'bbox'),
])
def test_bad_predictions_are_named(pred, message):
    with pytest.raises(ValueError, match=message):
        drawn_label_share(_gt(), [pred])


def test_not_a_coco_dict_is_refused():
    with pytest.raises(ValueError, match='annotations'):
        drawn_label_share(dict(images=[], categories=[]), [])
