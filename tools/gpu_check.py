#!/usr/bin/env python
"""GPU check with torch and timm alone; see docs/gpu.md.

    python tools/gpu_check.py --json work_dirs/gpu_check.json

needs posmlp_dense importable (the project's environment installs it). On
a machine where it is not installed (the GPU test machine), run the same
command as a module from the repository root, which takes the package
from the source tree:

    python -m benchmarks.gpu_check --json $OUT/gpu_check.json
"""
import sys

from benchmarks.gpu_check import main

if __name__ == '__main__':
    sys.exit(main())
