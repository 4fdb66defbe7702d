"""verify's own failures at the command boundary: exit code 2 and one line on stderr, never a traceback, and never
exit code 1, which is a verdict (FAIL) or, under `verify run`, a script that failed.

Every command runs its body through `exit_with()`. A `verify.errors.VerifyFailure` (CompareError, PairError,
VerifyError, RunDirError) or an OSError is expected: its message is the line. SIGINT, SIGTERM (what `timeout` and CI
send) and SIGHUP raise `verify.errors.Stopped` in the body: the runner stops what it started and marks its run
interrupted (verify/launch/runner.py), and the command exits 128 + the signal's number (130, 143, 129) with one
line. Anything else is a bug in verify: the line says what verify was doing and what went wrong, and the traceback
is kept in a file for the bug report (in the command's output folder when there is one, else in the temporary
folder). Imports neither torch nor pandas.
"""

from __future__ import annotations

import contextlib
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from verify.contract.files import TRACEBACK_FILE
from verify.errors import EXIT_ERROR, Stopped, VerifyFailure
from verify.launch.signals import stopped_by_signals
from verify.record.schema import shown

stderr = Console(stderr=True, highlight=False, soft_wrap=True)


def exit_with(body: Callable[[], int], doing: str, out: Path | None = None) -> NoReturn:
    """Runs a command's body and exits with the code it returns. `doing` completes "verify could not ..." and names
    the paths (e.g. "compare runs/gpu with runs/npu"); `out` is where a traceback is kept."""
    try:
        with stopped_by_signals():
            code = body()
    except Stopped as stop:
        _stopped_line(stop)
        raise typer.Exit(stop.exit_code) from None
    except (VerifyFailure, OSError) as error:
        _error_line(str(error))
        raise typer.Exit(EXIT_ERROR) from None
    except Exception as error:  # a bug in verify: a line, not a traceback, and not a verdict
        _error_line(f"verify could not {doing}: {type(error).__name__}: {error} (verify's own error, not a verdict; "
                    f"{_keep_traceback(out)})")
        raise typer.Exit(EXIT_ERROR) from None
    raise typer.Exit(code)


def _stopped_line(stop: Stopped) -> None:
    kept = f"; what they recorded is kept in {', '.join(map(str, stop.runs))} (interrupted)" if stop.runs else ""
    with contextlib.suppress(OSError):  # after SIGHUP the terminal may be gone: the exit code still says it
        stderr.print(f"[bold red]stopped:[/] verify received {stop.signal_name} and stopped every process it started"
                     f"{escape(kept)}")


def _error_line(message: str) -> None:
    stderr.print(f"[bold red]error:[/] {escape(shown(' '.join(message.split())))}")


def _keep_traceback(out: Path | None) -> str:
    text = traceback.format_exc()
    try:
        if out is not None and out.is_dir():
            path = out / TRACEBACK_FILE
            path.write_text(text, encoding="utf-8")
        else:
            with tempfile.NamedTemporaryFile("w", prefix="verify-traceback-", suffix=".txt", delete=False,
                                             encoding="utf-8") as file:
                file.write(text)
                path = Path(file.name)
    except OSError as error:
        return f"its traceback could not be kept: {error}"
    return f"please report it with its traceback, kept in {path}"
