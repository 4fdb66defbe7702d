"""verify's errors and exit codes, in one place. Every command exits 0 (PASS, or the requested steps ran), 1 (FAIL,
or the script failed), 2 (verify's own error), or, stopped by a signal, 128 + its number as shells do (130 SIGINT,
143 SIGTERM, 129 SIGHUP: `Stopped`). A `VerifyFailure` is an error verify expects and explains in one
line (verify/cli/exits.py prints it and exits 2); any other exception is a bug in verify, also exit 2, never read as
a verdict. Imports only the standard library, so every part of verify, the training process's included, raises them.
"""

from __future__ import annotations

import errno
import signal


# Exit codes of every verify command: PASS / the requested steps ran; FAIL / the script failed; verify's own error.
EXIT_OK, EXIT_FAILED, EXIT_ERROR = 0, 1, 2
_EXIT_SIGNALLED = 128  # + the signal's number, as a shell reports a command a signal ended
# The signals that stop verify (Stopped), and that verify stops its runs with: held while it starts or stops a run
# (verify/launch/process_tree.py), heard again in the child (verify/capture/lifetime.py)
STOPPING_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


class VerifyFailure(Exception):
    """verify cannot do what it was asked (an unreadable run directory, a folder in the way, a pair that proves
    nothing): exit code 2, and the message is the one line the user reads, naming the paths
    (verify/cli/exits.py)."""


class ManifestError(VerifyFailure, ValueError):
    """A manifest that does not follow RunManifest: the message names the field (the reader adds the path)."""


class RunDirError(VerifyFailure, ValueError):
    """A run directory that cannot be read, or a name in it that points outside it."""


class CompareError(VerifyFailure):
    """Inputs that cannot be compared at all (unreadable run directory, unsafe path): exit code 2."""


class ProvenanceError(CompareError):
    """Evidence that is not what it is used as (verify/record/provenance.py): a calibration run of another reference, a
    --ref-run of another script, arguments, seed or steps, a summary's runs gone or replaced: exit code 2."""


class PairError(VerifyFailure):
    """The pair cannot be run as asked (a missing port, a folder in the way, a failed side of verify's own): exit 2."""


class VerifyError(VerifyFailure):
    """verify itself cannot do the run (bad options, unusable device, a run directory in the way): exit code 2."""


class CaptureFailed(VerifyFailure):
    """verify's capture failed on what the script computed (its statistics, its records): a bug of verify's, named
    with where it failed, never the script's crash nor a rank the launcher stopped; exit 2."""


class DiskFull(VerifyFailure):
    """A write of verify's own failed for want of space: a full disk, a quota, a file-size limit (RLIMIT_FSIZE). The
    run stops at once and its manifests are closed where any space is left; exit 2 with this line."""

    ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})

    @classmethod
    def of(cls, error: OSError, path: object) -> "DiskFull":
        return cls(f"no space left to write {path} ({error.strerror or error}): free some space on its disk, or "
                   "write elsewhere (-o)")


class EmulationError(ValueError):
    """The emulation cannot be set up as asked."""


class Stopped(BaseException):
    """verify was asked to stop (SIGINT, SIGTERM, SIGHUP; verify/cli/exits.py raises it in the main thread): what it
    started is stopped and its runs are marked interrupted (verify/launch/runner.py adds each to `runs`), then it
    exits 128 + the signal's number. A BaseException, like KeyboardInterrupt: no `except Exception` swallows it."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.runs: list = []  # the run directories it interrupted
        super().__init__(self.signal_name)

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return _EXIT_SIGNALLED + self.signum
