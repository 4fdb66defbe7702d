"""Which files of the script's project a run imported: a port whose imports still name the original modules runs
them, not their ports (issue 35), and the pair names it (verify/compare/findings.py)."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

_VERIFY = Path(__file__).resolve().parents[1]


def imported(script: str, folder: Path) -> dict[str, str]:
    """The Python files under `folder` (manifest.files_root) that the run imported (sys.modules at its end), the
    script itself, verify's own modules and installed packages (a virtual environment in the folder) left out: each
    path relative to the folder, with its sha256."""
    folder = folder.resolve()
    found: dict[str, str] = {}
    for module in list(sys.modules.values()):
        name = getattr(module, "__file__", None)
        if not isinstance(name, str) or not name.endswith(".py"):
            continue
        path = Path(name).resolve()
        if (path == Path(script).resolve() or not path.is_relative_to(folder) or path.is_relative_to(_VERIFY)
                or "site-packages" in path.parts):
            continue
        try:
            found[path.relative_to(folder).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError:
            continue  # removed while the run ran: nothing to hash
    return dict(sorted(found.items()))
