"""npu-port migrate: rewrite PyTorch GPU training scripts for Ascend NPUs with libcst. Never imports torch.

migrate drives the rules (files -> engine -> rules); the rules import nothing from here.
"""

import importlib
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("npu-port")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0+unknown"

# The engine (libcst, the rules' machinery) is imported on first use (PEP 562): `migrate --version` reads only
# __version__.
_PUBLIC = {
    "SourceError": "migrate.types",
    "MigrationResult": "migrate.types",
    "migrate_source": "migrate.engine",
    "Finding": "rules",
    "Mode": "rules",
    "Settings": "rules",
}


def __getattr__(name: str) -> object:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'migrate' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = ["__version__", *_PUBLIC]
