_base_ = './retinanet_posmlp_t_fpn_1x_coco.py'
pretrained = 'checkpoints/posmlp_s_imagenet.pth'  # noqa

model = dict(
    backbone=dict(
        arch='s', init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[256, 512, 1024]))
