# Semantic FPN with a PosMLP-T backbone on ADE20K, 40k iterations, AdamW
# (the recipe PVT and PoolFormer use for Semantic FPN).
_base_ = [
    'mmseg::sem_fpn/fpn_r50_4xb4-160k_ade20k-512x512.py',
    './_base_/posmlp_runtime.py',
]
pretrained = 'checkpoints/posmlp_t_imagenet.pth'  # noqa

model = dict(
    pretrained=None,
    backbone=dict(
        _delete_=True,
        type='PosMLP',
        arch='t',
        gate='gqpe',
        out_indices=(0, 1, 2, 3),
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[96, 192, 384, 768]))

iters = 40000
train_cfg = dict(type='IterBasedTrainLoop', max_iters=iters,
                 val_interval=4000)
# Checkpoints are written to a temporary file and renamed into place, so a
# run killed mid-write never leaves a partial epoch_N.pth / iter_N.pth.
default_hooks = dict(
    checkpoint=dict(by_epoch=False, interval=4000,
                    backend_args=dict(backend='local_atomic')))
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=0.0002, weight_decay=0.0001),
    paramwise_cfg=_base_.posmlp_paramwise_cfg)
param_scheduler = [
    dict(type='PolyLR', power=0.9, eta_min=0.0, begin=0, end=iters,
         by_epoch=False)
]
