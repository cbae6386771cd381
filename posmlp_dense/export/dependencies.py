"""The optional packages that ONNX export needs, checked before any work."""
from __future__ import annotations

from ..optional_deps import is_installed

# torch's dynamo exporter writes the graph with onnxscript and onnx;
# onnxruntime runs the file to check it.
EXPORT_PACKAGES = ('onnx', 'onnxscript', 'onnxruntime')


class ExportDependencyError(ImportError):
    """A package of the ``export`` extra is not installed."""


def require_export_dependencies():
    """Raise ExportDependencyError naming every missing export package."""
    missing = [name for name in EXPORT_PACKAGES if not is_installed(name)]
    if missing:
        raise ExportDependencyError(
            f'ONNX export needs {", ".join(missing)}, which '
            f'{"is" if len(missing) == 1 else "are"} not installed; install '
            f'the export extra: pip install -e ".[export]" (or pip install '
            f'-r requirements/export.txt)')
