_base_ = './fpn_posmlp_t_4xb4-40k_ade20k-512x512.py'
pretrained = 'checkpoints/posmlp_s_imagenet.pth'  # noqa

model = dict(
    backbone=dict(
        arch='s', init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[128, 256, 512, 1024]))
