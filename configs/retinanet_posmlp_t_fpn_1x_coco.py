_base_ = [
    'mmdet::retinanet/retinanet_r50_fpn_1x_coco.py',
    './_base_/posmlp_runtime.py',
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
