"""The line length a project keeps its code to, as its own configuration says: the first folder, from the file's own
upwards to the project's root (the folder with pyproject.toml or .git), whose pyproject.toml (`[tool.ruff]` or
`[tool.black]` `line-length`), setup.cfg or .flake8 (`[flake8]` `max-line-length`) sets one.

Without one, the rules keep to the file's own longest line (`rules.line_limit`).
"""

from __future__ import annotations

import configparser
from functools import lru_cache
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pyproject.toml goes unread, setup.cfg and .flake8 are still read
    tomllib = None  # type: ignore[assignment]

_FLAKE8_FILES = ("setup.cfg", ".flake8")


def configured_line_length(path: Path) -> int | None:
    """The line length configured for the project of `path` (a file), None where none is."""
    return _from(path.resolve().parent)


@lru_cache(maxsize=None)
def _from(folder: Path) -> int | None:
    found = _pyproject(folder / "pyproject.toml")
    for name in _FLAKE8_FILES:
        found = found or _flake8(folder / name)
    at_root = (folder / "pyproject.toml").is_file() or (folder / ".git").exists() or folder.parent == folder
    return found if found or at_root else _from(folder.parent)


def _pyproject(path: Path) -> int | None:
    if tomllib is None or not path.is_file():
        return None
    try:
        tools = tomllib.loads(path.read_text(encoding="utf-8")).get("tool", {})
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None  # a file we cannot read configures nothing we can honour
    for tool in ("ruff", "black"):
        value = tools.get(tool, {}).get("line-length") if isinstance(tools.get(tool), dict) else None
        if isinstance(value, int) and value > 0:
            return value
    return None


def _flake8(path: Path) -> int | None:
    if not path.is_file():
        return None
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(path, encoding="utf-8")
    except (OSError, UnicodeDecodeError, configparser.Error):
        return None
    value = parser.get("flake8", "max-line-length", fallback="").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None
