# RetinaNet with a PosMLP-T backbone on COCO: mmdet's RetinaNet R-50 1x
# (the same bases) with the backbone swapped and AdamW.
_base_ = [
    'mmdet::_base_/models/retinanet_r50_fpn.py',
    'mmdet::_base_/datasets/coco_detection.py',
    'mmdet::retinanet/retinanet_tta.py',
    './_base_/schedules/posmlp_adamw_1x.py',
    './_base_/posmlp_det_runtime.py',
]
# The released ImageNet checkpoint of PosMLP-T, as the authors publish it
# (it is read as it is: EMA weights, head dropped, tables resized if needed).
pretrained = 'checkpoints/posmlp_t_imagenet.pth'  # noqa

model = dict(
    backbone=dict(
        _delete_=True,
        type='PosMLP',
        arch='t',
        gate='gqpe',
        out_indices=(1, 2, 3),
        drop_path_rate=0.2,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[192, 384, 768], start_level=0, num_outs=5))
