"""Packaging for posmlp_dense.

The full environment (torch, mmcv with its compiled ops, mmdet, mmseg, ...)
is made by `make env` (tools/setup_env.sh); see README.md. This file only
describes the package itself.
"""
import os

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))


def read_version():
    """Read __version__ from posmlp_dense/version.py without importing the
    package (its import needs torch)."""
    scope = {}
    with open(os.path.join(HERE, 'posmlp_dense', 'version.py')) as f:
        exec(f.read(), scope)
    return scope['__version__']


def read_requirements(name):
    """Requirement lines of requirements/<name>.txt, comments dropped."""
    reqs = []
    with open(os.path.join(HERE, 'requirements', name + '.txt')) as f:
        for line in f:
            line = line.split('#', 1)[0].strip()
            if line:
                reqs.append(line)
    return reqs


def read_readme():
    path = os.path.join(HERE, 'README.md')
    if not os.path.exists(path):
        return ''
    with open(path, encoding='utf-8') as f:
        return f.read()


setup(
    name='posmlp_dense',
    version=read_version(),
    description='PosMLP vision-MLP backbone for OpenMMLab detection and '
    'segmentation',
    long_description=read_readme(),
    long_description_content_type='text/markdown',
    # posmlp_dense is the model; benchmarks, the instruments of the tools
    # that time it, is a top-level package of its own (not inside the model)
    # so that tools/*.py import it as they import posmlp_dense.
    packages=find_packages(include=('posmlp_dense', 'posmlp_dense.*',
                                    'benchmarks', 'benchmarks.*')),
    python_requires='>=3.9',
    install_requires=read_requirements('runtime'),
    extras_require={
        'mm': read_requirements('mm'),
        'tests': read_requirements('tests'),
        'export': read_requirements('export'),
    },
    zip_safe=False,
)
