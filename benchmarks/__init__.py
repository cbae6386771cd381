"""The benchmark of posmlp_dense: the instruments behind
``tools/benchmark.py``, ``tools/compare_models.py`` and
``tools/compare_versions.py``.

A package of its own, next to ``posmlp_dense`` and not in it: the model
needs none of this, and ``import posmlp_dense`` loads none of it.

- ``measure``: the instruments (timing, peak memory, saved activations,
  MACs, matmul calibration, the interleaved runner, the scaling fit);
- ``models``: the compared backbones; ``published_port``: the published
  computation, the speed baseline of the token mixing;
- ``inference`` and ``training``: the two parts of the benchmark
  (``fresh_process`` is the entry point of a training row's fresh process);
- ``isolated``: backbones timed each in a process of its own;
- ``gpu_proxy``: device-independent GPU figures of a step (operations,
  bytes written, host syncs, FLOPs), in fp32 and bf16, and the time they
  imply on a GPU;
- ``report``: target ratios, Markdown tables and the chart;
  ``like_for_like``: the CPU table of PosMLP-T against Swin-T;
  ``doc_sections``: the generated sections of docs/performance.md;
- ``cli_sizes``: the one parser of the sizes the tools take on their
  command lines.
"""
