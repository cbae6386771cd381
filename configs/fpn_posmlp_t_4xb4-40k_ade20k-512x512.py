# Semantic FPN with a PosMLP-T backbone on ADE20K: mmseg's Semantic FPN R-50
# (the same bases) with the backbone swapped, 40k iterations and AdamW (the
# recipe PVT and PoolFormer use for Semantic FPN).
_base_ = [
    'mmseg::_base_/models/fpn_r50.py',
    'mmseg::_base_/datasets/ade20k.py',
    './_base_/schedules/posmlp_adamw_40k.py',
    './_base_/posmlp_seg_runtime.py',
]
crop_size = (512, 512)
data_preprocessor = dict(size=crop_size)
pretrained = 'checkpoints/posmlp_t_imagenet.pth'  # noqa

model = dict(
    data_preprocessor=data_preprocessor,
    pretrained=None,  # the base's ResNet weights are not PosMLP's
    backbone=dict(
        _delete_=True,
        type='PosMLP',
        arch='t',
        gate='gqpe',
        out_indices=(0, 1, 2, 3),
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[96, 192, 384, 768]),
    decode_head=dict(num_classes=150))
