"""The op capture's compiled hook (verify/capture/_op_hook.cpp), built against the torch a run imports.

pip cannot build it: its build runs in isolation, without the user's torch, whose headers and ABI it needs. It is
built at the first capture on a machine, once per torch version, Python and source, by torch.utils.cpp_extension
(ninja and a C++ compiler; 20-70 s on two cores, told on stderr), and kept in a cache folder: $NPU_PORT_CACHE, else
npu-port/ under $XDG_CACHE_HOME or ~/.cache. Each build runs in a scratch folder of its own and its library is moved
into the cache in one rename, so that runs started together (a pair's sides) never load a half-written one. Later
runs import the library from there, in milliseconds.

Optional, as verify/capture/_stats.c is: where it cannot be built (no compiler, no ninja, a torch whose headers
differ) or NPU_PORT_OP_HOOK=0 turns it off, the capture's ops go through its Python handler with the same records,
and the manifest says which path ran and why (ops.dispatch_path). A build that failed leaves its reason beside where
the library would be (`.failed`), so that later runs of that torch take the Python path at once.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import torch

SOURCE = Path(__file__).with_name("_op_hook.cpp")
_NAME = "npu_port_op_hook"  # the library's module name, which its PyInit_ function carries
SWITCH = "NPU_PORT_OP_HOOK"  # "0": the Python path, as where the hook cannot be built

_loaded: ModuleType | None = None
_why_not: str | None = None  # why the hook is not there, once a load was tried


def cache_folder() -> Path:
    explicit = os.environ.get("NPU_PORT_CACHE")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "npu-port"


def library_path() -> Path:
    """Where the library built for this torch, Python and source lies."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    version = torch.__version__.replace("+", "_")
    return cache_folder() / f"op_hook-torch{version}-{sys.implementation.cache_tag}-{digest}.so"


def hook() -> ModuleType | None:
    """The hook's module, built first where it is not yet; None where it cannot be (`why_not` says why)."""
    global _loaded, _why_not
    if _loaded is not None or _why_not is not None:
        return _loaded
    if os.environ.get(SWITCH) == "0":
        _why_not = f"{SWITCH}=0"
        return None
    library = library_path()
    failed = library.with_suffix(".failed")  # a build that failed is not tried again by every run
    if failed.exists():
        _why_not = f"{failed.read_text().strip()} (delete {failed} to build it again)"
        return None
    try:
        _loaded = _imported(library) if library.exists() else _built(library)
    except Exception as error:  # noqa: BLE001  (any failure to build or load: the Python path runs, and says why)
        _why_not = _first_error(str(error)) or type(error).__name__
        print(f"npu-port: the op hook is not there ({_why_not}); the capture takes its slower path, with the same "
              "records", file=sys.stderr, flush=True)
        with contextlib.suppress(OSError):
            failed.write_text(_why_not + "\n")
    return _loaded


def _first_error(message: str) -> str:
    """The line of a failure that says what failed: a compiler's first `error:` (its output follows the command
    line), else the message's first line; one line, at most 300 characters."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    named = next((line for line in lines if "error:" in line.lower()), lines[0] if lines else "")
    return named[:300]


def why_not() -> str | None:
    return _why_not


def _imported(library: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(_NAME, library)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _built(library: Path) -> ModuleType:
    from torch.utils.cpp_extension import load

    library.parent.mkdir(parents=True, exist_ok=True)
    print(f"npu-port: building the capture's compiled op hook for torch {torch.__version__} (once per torch "
          f"version, up to a minute) into {library.parent}", file=sys.stderr, flush=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=library.parent, prefix="build-") as scratch:
        with contextlib.redirect_stdout(io.StringIO()):  # ninja's progress: the script's stdout is the user's
            module = load(_NAME, [str(SOURCE)], build_directory=scratch, extra_cflags=["-O2"], verbose=False)
        staged = Path(scratch) / "staged.so"
        shutil.copyfile(module.__file__, staged)
        os.replace(staged, library)
    print(f"npu-port: op hook built in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    return module
