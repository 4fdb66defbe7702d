"""Runs inside the child process that `verify run` starts: `python -P -m verify.capture.bootstrap RUNDIR PID`, PID
being the process that started it, with which it dies (verify/capture/lifetime.py).

RUNDIR/manifest.json, written by the runner, is the whole configuration. The bootstrap seeds every generator,
installs the instrumentation (verify/capture/session.py), then runs the user's script unmodified with `runpy` as
`__main__`. Where the manifest asks for ranks (nproc_per_node), it runs torch's own launcher instead (with the
rendezvous of a run across several machines where the manifest has one: manifest.nodes), which starts it again as
each rank (`... RUNDIR PID --rank`); an elastic launch in the script starts it so too, naming the script its
ranks run (`... --rank SCRIPT ARGS`).

What a run records and when a step ends: verify/capture/step_recorder.py; the loss-scaler twin a reference plays:
verify/capture/loss_scaler_twin.py.
"""

from __future__ import annotations

import os
import runpy
import sys
from dataclasses import replace
from pathlib import Path

from verify.capture import rank_capture
from verify.capture.lifetime import die_with_parent, signals_heard
from verify.capture.session import instrumented, spawned_ranks_captured
from verify.record.schema import Nodes, Status
from verify.record.store import read_manifest

def run(run_dir: Path, launched: list[str] | None = None) -> Status:
    """The whole child: prepare, instrument, run the script, write the final manifest. A rank that a launcher started
    (`launched`: torch.distributed.run for --nproc-per-node, or the script's own elastic launch, whose script and
    arguments it holds) writes into its own folder of the run directory; ranks the script spawns itself are captured
    too (session.spawned_ranks_captured), and refused in a rank --nproc-per-node launched."""
    manifest = read_manifest(run_dir)
    if launched is not None:
        if launched:
            manifest = replace(manifest, script=launched[0], argv=launched[1:])
        run_dir, manifest = rank_capture.open_rank_dir(run_dir, manifest, rank_capture.launched_rank(),
                                                       int(os.environ["WORLD_SIZE"]))
    with spawned_ranks_captured(run_dir, manifest):
        return instrumented(run_dir, manifest, lambda: runpy.run_path(manifest.running_script, run_name="__main__"))


def launch_ranks(run_dir: Path, nproc_per_node: int, nodes: Nodes | None) -> None:
    """torch's own launcher, in this process as `python -m torch.distributed.run` would run it: it starts this
    bootstrap as `nproc_per_node` ranks on this node, each in a session of its own, each dying with this process;
    standalone, or as one of `nodes` meeting at their rendezvous (verify/launch/nodes.py)."""
    rank = rank_capture.rank_command(run_dir)
    where = nodes.launcher_args() if nodes else ["--standalone"]
    sys.argv = ["torch.distributed.run", "--nproc-per-node", str(nproc_per_node), *where, "--no-python", *rank]
    runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)


def main() -> None:
    run_dir, parent, role = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    die_with_parent(parent)
    signals_heard()
    launched = role[1:] if role[:1] == [rank_capture.RANK_ROLE] else None
    manifest = read_manifest(run_dir)
    if manifest.nproc_per_node and launched is None:
        launch_ranks(run_dir, manifest.nproc_per_node, Nodes.from_record(manifest.nodes))  # its failures are the launcher's: exit code 1 and a traceback
        return
    status = run(run_dir, launched)
    sys.stdout.flush()
    sys.stderr.flush()
    # The script was stopped mid-flight: its leftover threads and atexit handlers must not keep the process alive.
    os._exit(0 if status in (Status.OK, Status.SHORT) else 1)


if __name__ == "__main__":
    main()
