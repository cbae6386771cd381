#!/usr/bin/env python
"""Pretrain a PosMLP classifier on an ImageFolder tree (ImageNet-1k).

    torchrun --nproc_per_node=8 tools/pretrain.py --model posmlp_s \
        --data /path/to/imagenet --output work_dirs/pretrain/posmlp_s
    python tools/pretrain.py --help      # recipe overrides, CPU example

The published recipe of the model is used unless a flag changes it.
Checkpoints (``last.pth``, ``best.pth``) hold ``state_dict`` and
``state_dict_ema`` like the released files: ``init_cfg=dict(type=
'Pretrained', checkpoint='<output>/last.pth')`` and
``posmlp_dense.load_pretrained`` read them as they are.
"""
from posmlp_dense.pretraining.cli import main
from posmlp_dense.known_warnings import hide_known_third_party_warnings

if __name__ == '__main__':
    hide_known_third_party_warnings()
    main()
