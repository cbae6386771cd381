"""Benchmark instruments behind ``tools/benchmark.py``.

Not imported by ``posmlp_dense`` itself: the model needs none of it.

- ``measure``: the instruments (timing, peak memory, saved activations,
  MACs, matmul calibration, the interleaved runner, the scaling fit);
- ``models``: the compared backbones; ``published_port``: the published
  computation, the speed baseline of the token mixing;
- ``inference`` and ``training``: the two parts of the benchmark
  (``fresh_process`` is the entry point of a training row's fresh process);
- ``report``: target ratios, Markdown tables and the chart.
"""
