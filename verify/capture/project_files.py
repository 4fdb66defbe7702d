"""Which files of the script's project a run imported: a port whose imports still name the original modules runs
them, not their ports (issue 35), and the pair names it (verify/compare/findings.py)."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

_VERIFY = Path(__file__).resolve().parents[1]


def imported(script: str, *folders: Path) -> dict[str, str]:
    """The Python files under `folders` (the run's view of manifest.files_root, and files_root itself, which a script
    may put on its search path by an absolute path) that the run imported (sys.modules at its end), the script
    itself, verify's own modules and installed packages (a virtual environment in the folder) left out: each path
    relative to the first folder holding it, with its sha256."""
    folders = tuple(folder.resolve() for folder in folders)
    found: dict[str, str] = {}
    for module in list(sys.modules.values()):
        name = getattr(module, "__file__", None)
        if not isinstance(name, str) or not name.endswith(".py"):
            continue
        path = Path(name).resolve()
        folder = next((folder for folder in folders if path.is_relative_to(folder)), None)
        if (path == Path(script).resolve() or folder is None or path.is_relative_to(_VERIFY)
                or "site-packages" in path.parts):
            continue
        try:
            found[path.relative_to(folder).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError:
            continue  # removed while the run ran: nothing to hash
    return dict(sorted(found.items()))
