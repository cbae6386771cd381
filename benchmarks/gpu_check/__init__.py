"""A GPU check that needs only torch, timm and the ONNX packages.

``python -m benchmarks.gpu_check`` from the repository root (see
``cli.py`` and docs/gpu.md): device against CPU numerics, autocast,
training steps, speed and memory against timm's Swin-T and ResNet-50,
torch.compile, ONNX export, and (where OpenMMLab is importable) a
RetinaNet iteration. Nothing here imports an OpenMMLab package unless the
detector checks run and find it installed.
"""
from .cli import main

__all__ = ['main']
