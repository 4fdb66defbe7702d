"""What is still running: the tests that stop verify (test_stopping.py) and its ranks (test_ranks.py) look in /proc for
any process left behind."""

from pathlib import Path


def processes_naming(path: Path) -> list[str]:
    """The command lines of the living processes that name `path` (verify, the bootstrap, a launcher, a rank, a
    worker, an orphan)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if entry.name.isdigit() and str(path) in command:
            found.append(command)
    return found
