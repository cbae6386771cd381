# Mask R-CNN with a PosMLP-T backbone on COCO: mmdet's Mask R-CNN R-50 1x
# (the same bases) with the backbone swapped, AdamW and a longer warm-up.
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    'mmdet::_base_/datasets/coco_instance.py',
    './_base_/schedules/posmlp_adamw_1x.py',
    './_base_/posmlp_det_runtime.py',
]
pretrained = 'checkpoints/posmlp_t_imagenet.pth'  # noqa

model = dict(
    backbone=dict(
        _delete_=True,
        type='PosMLP',
        arch='t',
        gate='gqpe',
        out_indices=(0, 1, 2, 3),
        drop_path_rate=0.2,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[96, 192, 384, 768]))

max_epochs = 12
param_scheduler = [
    dict(
        type='LinearLR', start_factor=0.001, by_epoch=False, begin=0,
        end=1000),
    dict(
        type='MultiStepLR',
        begin=0,
        end=max_epochs,
        by_epoch=True,
        milestones=[8, 11],
        gamma=0.1)
]
