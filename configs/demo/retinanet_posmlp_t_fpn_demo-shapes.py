# The out-of-the-box demo: RetinaNet-PosMLP on the built-in shapes set
# (python tools/make_demo_data.py), small enough to train on a CPU in
# minutes. It inherits the real COCO config and changes only the data, the
# image size, the schedule, the model width, the head's depth and the NMS.
_base_ = ['../retinanet_posmlp_t_fpn_1x_coco.py',
          '../_base_/posmlp_demo_backbone.py']

classes = ('circle', 'square', 'triangle')
palette = [(220, 20, 60), (0, 130, 255), (255, 190, 0)]
data_root = 'data/demo_coco/'
image_scale = (256, 192)  # (w, h), the size the set is generated at

model = dict(
    backbone={{_base_.demo_backbone}},
    neck=dict(in_channels=[64, 128, 256], out_channels=64),
    # two stacked convs per branch, not RetinaNet's four: the head's and
    # neck's convolutions took over a third of a CPU training step, and
    # three solid shapes need no deeper head
    bbox_head=dict(num_classes=len(classes), in_channels=64,
                   feat_channels=64, stacked_convs=2),
    # The shapes never overlap, so two boxes on one place are one guess
    # too many: keep the best-scored whatever its class (mmcv's
    # class-agnostic NMS; post-processing, which tools/demo.py names
    # beside its figures).
    test_cfg=dict(nms=dict(class_agnostic=True)))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='Resize', scale=image_scale, keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=image_scale, keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                    'scale_factor')),
]
train_dataloader = dict(
    batch_size=8,
    num_workers=1,
    dataset=dict(
        data_root=data_root,
        metainfo=dict(classes=classes, palette=palette),
        ann_file='annotations/instances_train.json',
        data_prefix=dict(img='train/'),
        pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=8,
    num_workers=1,
    dataset=dict(
        data_root=data_root,
        metainfo=dict(classes=classes, palette=palette),
        ann_file='annotations/instances_val.json',
        data_prefix=dict(img='val/'),
        pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json')
test_evaluator = val_evaluator

max_epochs = 24
train_cfg = dict(max_epochs=max_epochs, val_interval=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0,
         end=50),
    dict(type='CosineAnnealingLR', by_epoch=True, begin=0, end=max_epochs,
         eta_min=1e-5),
]
optim_wrapper = dict(optimizer=dict(lr=1e-3))
default_hooks = dict(
    logger=dict(interval=8),
    checkpoint=dict(interval=max_epochs, max_keep_ckpts=2),
    # the pictures show the boxes tools/demo.py scores for their labels
    visualization=dict(score_thr=0.5))
randomness = dict(seed=0)
