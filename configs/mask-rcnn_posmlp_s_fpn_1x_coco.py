_base_ = './mask-rcnn_posmlp_t_fpn_1x_coco.py'
pretrained = 'checkpoints/posmlp_s_imagenet.pth'  # noqa

model = dict(
    backbone=dict(
        arch='s',
        drop_path_rate=0.3,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[128, 256, 512, 1024]))
