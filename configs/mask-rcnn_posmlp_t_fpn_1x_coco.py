_base_ = [
    'mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py',
    './_base_/posmlp_runtime.py',
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
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(
        type='AdamW', lr=0.0001, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=_base_.posmlp_paramwise_cfg)

# Checkpoints are written to a temporary file and renamed into place, so a
# run killed mid-write never leaves a partial epoch_N.pth / iter_N.pth.
default_hooks = dict(
    checkpoint=dict(backend_args=dict(backend='local_atomic')))
