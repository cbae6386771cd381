"""The GPU check, ``python -m benchmarks.gpu_check``: torch, timm and the
ONNX packages only; OpenMMLab's rows run where it imports (docs/gpu.md)."""
from .cli import main

__all__ = ['main']
