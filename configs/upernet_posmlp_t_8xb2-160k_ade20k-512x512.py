# UperNet with a PosMLP-T backbone on ADE20K, 160k iterations (Swin's recipe).
_base_ = [
    'mmseg::swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py',  # noqa
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
        drop_path_rate=0.3,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    decode_head=dict(in_channels=[96, 192, 384, 768], num_classes=150),
    auxiliary_head=dict(in_channels=384, num_classes=150))

optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(
        type='AdamW', lr=0.00006, betas=(0.9, 0.999), weight_decay=0.01),
    paramwise_cfg=_base_.posmlp_paramwise_cfg)

# Checkpoints are written to a temporary file and renamed into place, so a
# run killed mid-write never leaves a partial epoch_N.pth / iter_N.pth.
default_hooks = dict(
    checkpoint=dict(backend_args=dict(backend='local_atomic')))
