"""The test session's setup: verify's compiled op hook (verify/capture/op_hook.py) built once, before any test starts
a run. A run that found it missing would build it itself, spending up to a minute of its own time limit."""

from __future__ import annotations

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput"):  # an xdist worker: its controller built it before starting it
        return
    try:
        from verify.capture import op_hook
    except ImportError:  # no torch here: only migrate's and the rules' tests can run
        return
    op_hook.hook()
