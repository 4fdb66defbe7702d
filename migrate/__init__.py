"""npu-port migrate: rewrite PyTorch GPU training scripts for Ascend NPUs with libcst. Never imports torch."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("npu-port")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0+unknown"

from migrate.engine import SourceError, migrate_source  # noqa: E402
from migrate.types import Finding, MigrationResult, Mode, Settings  # noqa: E402

__all__ = ["Finding", "MigrationResult", "Mode", "Settings", "SourceError", "__version__", "migrate_source"]
