"""npu-port migrate: rewrite PyTorch GPU training scripts for Ascend NPUs with libcst. Never imports torch.

The public API (`migrate_source`, `Settings`, ...) is loaded on first use: the rules import `migrate.types`, and an
eager import of the engine here would import the rules back before they exist.
"""

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("npu-port")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0+unknown"

_PUBLIC = {
    "migrate_source": "migrate.engine",
    "SourceError": "migrate.engine",
    "Finding": "migrate.types",
    "MigrationResult": "migrate.types",
    "Mode": "migrate.types",
    "Settings": "migrate.types",
}


def __getattr__(name: str) -> object:
    if name in _PUBLIC:
        return getattr(import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'migrate' has no attribute {name!r}")


__all__ = ["__version__", *_PUBLIC]
