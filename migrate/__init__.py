"""npu-port migrate: rewrite PyTorch GPU training scripts for Ascend NPUs with libcst. Never imports torch.

migrate drives the rules (files -> engine -> rules); the rules import nothing from here.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("npu-port")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0+unknown"

from migrate.engine import SourceError, migrate_source  # noqa: E402 (after __version__, which the CLI imports)
from migrate.types import MigrationResult  # noqa: E402
from rules import Finding, Mode, Settings

__all__ = ["__version__", "Finding", "MigrationResult", "Mode", "Settings", "SourceError", "migrate_source"]
