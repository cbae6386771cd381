# RetinaNet with a PosMLP-S backbone on COCO (1x schedule, AdamW).
#   python tools/train.py configs/retinanet_posmlp_s_fpn.py
# PosMLP-S ImageNet weights were never released: pretrain them with
# tools/pretrain.py (docs/weights.md) and point `pretrained` at
# the result (--cfg-options model.backbone.init_cfg.checkpoint=PATH), or
# train from scratch: --cfg-options model.backbone.init_cfg=None.
_base_ = './retinanet_posmlp_s_fpn_1x_coco.py'
