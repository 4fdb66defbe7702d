"""verify's errors and exit codes, in one place. Every command exits 0 (PASS, or the requested steps ran), 1 (FAIL,
or the script failed) or 2 (verify's own error). A `VerifyFailure` is an error verify expects and explains in one
line (verify/cli/exits.py prints it and exits 2); any other exception is a bug in verify, also exit 2, never read as
a verdict. Imports only the standard library, so every part of verify, the training process's included, raises them.
"""

from __future__ import annotations


# Exit codes of every verify command: PASS / the requested steps ran; FAIL / the script failed; verify's own error.
EXIT_OK, EXIT_FAILED, EXIT_ERROR = 0, 1, 2


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


class PairError(VerifyFailure):
    """The pair cannot be run as asked (a missing port, a folder in the way, a failed side of verify's own): exit 2."""


class VerifyError(VerifyFailure):
    """verify itself cannot do the run (bad options, unusable device, a run directory in the way): exit code 2."""


class EmulationError(ValueError):
    """The emulation cannot be set up as asked."""
