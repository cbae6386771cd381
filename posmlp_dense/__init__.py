"""posmlp-dense: PosMLP backbones for dense prediction with OpenMMLab.

Plain PyTorch use needs only torch and timm::

    from posmlp_dense import PosMLP, load_pretrained
    backbone = PosMLP('t', out_indices=(0, 1, 2, 3))
    load_pretrained(backbone, 'posmlp_t_imagenet.pth')

Importing the package also registers ``PosMLP`` in the mmdet and mmseg model
registries when those frameworks are installed (``posmlp_dense/openmmlab/``), and
the timm models ``posmlp_t``, ``posmlp_s`` and ``posmlp_b``; nothing else. The
mmengine training runtime (atomic checkpoints, safe checkpoint loading, CPU
DDP) is opt-in: ``posmlp_dense.openmmlab.runtime``.
"""
from .version import __version__
from .archs import ARCH_SETTINGS
from .backbone import PosMLP
from .checkpoint import (CheckpointError, LoadReport, load_pretrained,
                         read_checkpoint, save_checkpoint)
from .classifier import PosMLPClassifier, create_posmlp_classifier
from .optional_deps import is_installed
from . import timm_models  # noqa: F401  (registers posmlp_t/s/b in timm)

# OpenMMLab is optional: plain PyTorch users need neither mmdet nor mmseg.
# Where mmengine is installed, a broken install fails loudly here.
if is_installed('mmengine'):
    from .openmmlab import register_all as _register_openmmlab
    _register_openmmlab()

__all__ = ['__version__', 'ARCH_SETTINGS', 'PosMLP', 'PosMLPClassifier',
           'create_posmlp_classifier', 'load_pretrained', 'read_checkpoint',
           'save_checkpoint', 'CheckpointError', 'LoadReport']
