"""The measuring kit behind ``tools/benchmark.py`` and ``python -m
benchmarks.gpu_check``; a package next to ``posmlp_dense``, which imports
none of it.

- ``timing``: the one timing function (``interleaved``) and peak memory;
- ``steps``: the measured steps, and the bytes autograd saves;
- ``models``, ``detectors``: the compared backbones and RetinaNets;
- ``timed_steps``, ``gpu_proxy``, ``inductor_counts``, ``versions``,
  ``mmengine_compile``: the measuring parts;
- ``targets``, ``tables``, ``doc_sections``: ratios, Markdown and the
  generated sections of docs/performance.md;
- ``environment``: what a run records of its machine;
- ``cli_sizes``: the sizes every tool takes on its command line;
- ``gpu_check``: the GPU check (torch, timm and ONNX only).
"""
