_base_ = './upernet_posmlp_t_8xb2-160k_ade20k-512x512.py'
pretrained = 'checkpoints/posmlp_s_imagenet.pth'  # noqa

model = dict(
    backbone=dict(
        arch='s', init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    decode_head=dict(in_channels=[128, 256, 512, 1024]),
    auxiliary_head=dict(in_channels=512))
