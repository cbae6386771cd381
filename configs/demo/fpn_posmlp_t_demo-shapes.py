# Semantic FPN with PosMLP on the built-in shapes segmentation set (python
# tools/make_demo_data.py), small enough to train on a CPU in minutes. It
# inherits the real ADE20K config and changes only the data, the image size,
# the schedule and the model width.
_base_ = ['../fpn_posmlp_t_4xb4-40k_ade20k-512x512.py',
          '../_base_/posmlp_demo_backbone.py']

classes = ('background', 'circle', 'square', 'triangle')
palette = [(120, 120, 120), (220, 20, 60), (0, 130, 255), (255, 190, 0)]
data_root = 'data/demo_ade'
crop_size = (192, 256)  # (h, w), the size the set is generated at
norm_cfg = dict(type='BN', requires_grad=True)  # SyncBN needs GPUs

data_preprocessor = dict(size=crop_size)
model = dict(
    data_preprocessor=data_preprocessor,
    backbone={{_base_.demo_backbone}},
    neck=dict(in_channels=[32, 64, 128, 256], out_channels=64),
    decode_head=dict(in_channels=[64, 64, 64, 64], channels=64,
                     num_classes=len(classes), norm_cfg=norm_cfg))

# The labels are stored ADE20K-style (0 = unlabelled, k = class k - 1).
# ADE20KDataset insists on ADE20K's own class names, so the generic
# BaseSegDataset reads them with the same convention.
dataset = dict(
    type='BaseSegDataset',
    data_root=data_root,
    img_suffix='.jpg',
    seg_map_suffix='.png',
    reduce_zero_label=True,
    metainfo=dict(classes=classes, palette=palette))
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations'),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations'),
    dict(type='PackSegInputs'),
]
train_dataloader = dict(
    batch_size=8,
    num_workers=1,
    persistent_workers=False,
    dataset=dict(
        dataset,
        data_prefix=dict(img_path='images/training',
                         seg_map_path='annotations/training'),
        pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=8,
    num_workers=1,
    persistent_workers=False,
    dataset=dict(
        dataset,
        data_prefix=dict(img_path='images/validation',
                         seg_map_path='annotations/validation'),
        pipeline=test_pipeline))
test_dataloader = val_dataloader

iters = 600
train_cfg = dict(max_iters=iters, val_interval=iters)
default_hooks = dict(
    logger=dict(interval=20),
    checkpoint=dict(interval=iters, max_keep_ckpts=2))
optim_wrapper = dict(optimizer=dict(lr=2e-3))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0,
         end=20),
    dict(type='PolyLR', power=0.9, eta_min=1e-5, begin=20, end=iters,
         by_epoch=False),
]
randomness = dict(seed=0)
