"""Runs inside the child process that `verify run` starts: `python -P -m verify.capture.bootstrap RUNDIR`.

RUNDIR/manifest.json, written by the runner, is the whole configuration. The bootstrap seeds every generator,
installs the instrumentation (verify/capture/session.py), then runs the user's script unmodified with `runpy` as
`__main__`.

What a run records and when a step ends: verify/capture/step_recorder.py; the loss-scaler twin a reference plays:
verify/capture/loss_scaler_twin.py.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

from verify.capture import rank_capture
from verify.capture.session import instrumented, spawned_ranks_captured
from verify.record.schema import Status
from verify.record.store import read_manifest


def run(run_dir: Path) -> Status:
    """The whole child: prepare, instrument, run the script, write the final manifest. A rank that
    torch.distributed.run started writes into its own folder of the run directory; ranks the script spawns itself
    are captured too (session.spawned_ranks_captured)."""
    manifest = read_manifest(run_dir)
    rank = rank_capture.launched_rank() if manifest.nproc_per_node else None
    if rank is not None:
        folder, manifest = rank_capture.open_rank_dir(run_dir, manifest, rank, int(os.environ["WORLD_SIZE"]))
        return instrumented(folder, manifest, lambda: runpy.run_path(manifest.script, run_name="__main__"))
    with spawned_ranks_captured(run_dir):
        return instrumented(run_dir, manifest, lambda: runpy.run_path(manifest.script, run_name="__main__"))


def main() -> None:
    status = run(Path(sys.argv[1]))
    sys.stdout.flush()
    sys.stderr.flush()
    # The script was stopped mid-flight: its leftover threads and atexit handlers must not keep the process alive.
    os._exit(0 if status in (Status.OK, Status.SHORT) else 1)


if __name__ == "__main__":
    main()
