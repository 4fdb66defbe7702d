"""A stopped verify stops everything it started (issue 36, items 3 and 4): `verify` started as a real process, stopped
with SIGTERM (what `timeout` and CI send), SIGINT (Ctrl-C) or SIGKILL while tests/verify/scripts/long_train.py
trains, then /proc searched for any process of the run, the manifest read for `interrupted` and the steps kept, and
the folders for writer locks. And the defaults that protect the machine: a timeout by default, ranks refused beyond
what the machine holds.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import typer
from hung_runs import timed_out, timed_out_in_the_hang
from live_processes import processes_naming
from typer.testing import CliRunner

from verify.cli import app
from verify.cli.pair import route
from verify.errors import EXIT_ERROR, EXIT_FAILED, Stopped
from verify.launch import runner
from verify.launch.runner import RunOptions, default_timeout, lead_dir, rank_limit
from verify.record.run_folders import WRITER_LOCK
from verify.record.schema import LOSSES, RunManifest
from verify.record.store import RunDirError, RunWriter, read_manifest, read_run, write_manifest

SCRIPTS = Path(__file__).resolve().parent / "scripts"
LONG = ["--", "100000"]  # steps long_train.py trains: far more than a test waits for
STARTED_S = 180  # torch imported and two steps made, on a busy shared machine


def until_nothing_survives(path: Path, within_s: float = 15.0) -> list[str]:
    deadline = time.monotonic() + within_s
    while (left := processes_naming(path)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def start_verify(tmp_path: Path, *args: str) -> subprocess.Popen:
    """`verify ARGS` as a process of its own, as a shell or CI starts it."""
    return subprocess.Popen([sys.executable, "-m", "verify", *args], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def until_steps(verify: subprocess.Popen, run_dir: Path, steps: int = 2) -> int:
    """Waits until the run (its lowest rank) has recorded `steps` steps; returns how many it has."""
    deadline = time.monotonic() + STARTED_S
    while time.monotonic() < deadline:
        assert verify.poll() is None, verify.communicate()
        try:
            done = read_manifest(lead_dir(run_dir)).steps_completed
        except RunDirError:
            done = 0  # not written yet
        if done >= steps:
            return done
        time.sleep(0.2)
    raise AssertionError(f"{run_dir} made fewer than {steps} steps in {STARTED_S} s")


def stopped_with(verify: subprocess.Popen, sig: signal.Signals) -> tuple[int, str]:
    verify.send_signal(sig)
    _, err = verify.communicate(timeout=60)
    return verify.returncode, err


def locks_in(folder: Path) -> list[Path]:
    return list(folder.rglob(WRITER_LOCK))


def long_script(tmp_path: Path, name: str = "long_train.py") -> Path:
    """long_train.py copied into tmp_path, so that every process it starts names tmp_path."""
    return Path(shutil.copy(SCRIPTS / "long_train.py", tmp_path / name))


def assert_interrupted(run_dir: Path, signal_name: str, at_least: int) -> None:
    run = read_run(run_dir)
    for manifest, losses in [(run.manifest, run.losses)] + [(rank.manifest, rank.losses) for rank in run.ranks]:
        assert manifest.status == "interrupted", manifest.message
        assert f"stopped by {signal_name}" in manifest.message
        assert manifest.steps_completed >= at_least and len(losses) == manifest.steps_completed


def test_exit_codes_of_a_stopped_verify_are_the_shells():
    assert [Stopped(sig).exit_code for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)] == [130, 143, 129]
    assert Stopped(signal.SIGTERM).signal_name == "SIGTERM"


def test_a_run_gets_a_timeout_by_default_scaled_to_its_steps_and_none_with_0():
    assert RunOptions(steps=20).timeout_s == default_timeout(20) > default_timeout(5) == RunOptions(steps=5).timeout_s
    assert RunOptions(steps=20, timeout=7).timeout_s == 7 and RunOptions(steps=20, timeout=0).timeout_s is None


def test_more_ranks_than_the_machine_holds_are_refused_before_anything_runs(tmp_path):
    limit, why = rank_limit()
    out = tmp_path / "run"
    argv = ["run", str(SCRIPTS / "tiny_train.py"), "--nproc-per-node", str(limit + 1), "-o", str(out)]
    result = CliRunner().invoke(app, route(argv, typer.main.get_command(app)))
    assert result.exit_code == EXIT_ERROR, result.output
    line = " ".join(result.output.split())
    assert f"--nproc-per-node {limit + 1} asks for more training processes than this machine holds ({why})" in line
    assert f"use at most {limit}, or add --force" in line and not out.exists()


@pytest.mark.slow
def test_sigterm_stops_the_run_and_the_setsid_orphan_it_started_and_marks_it_interrupted(tmp_path):
    """The issue's case: verify killed by SIGTERM, its child trained on and wrote `ok` 14 s later, locks left."""
    out = tmp_path / "run"
    verify = start_verify(tmp_path, "run", str(long_script(tmp_path)), "--steps", "100000", "-q", "-o", str(out),
                          *LONG, "--orphan")
    done = until_steps(verify, out)
    assert any("orphan-of" in command for command in processes_naming(tmp_path))
    code, err = stopped_with(verify, signal.SIGTERM)
    assert code == 143, err
    assert "stopped: verify received SIGTERM and stopped every process it started" in " ".join(err.split())
    assert "Traceback" not in err
    assert until_nothing_survives(tmp_path, within_s=2) == []
    assert_interrupted(out, "SIGTERM", done)
    assert locks_in(out) == []
    time.sleep(2)  # nothing writes into the run any more
    assert read_manifest(out).status == "interrupted"


@pytest.mark.slow
def test_sigint_stops_a_pair_and_leaves_no_lock(tmp_path):
    original = long_script(tmp_path)
    port = long_script(tmp_path, "long_train_npu.py")
    out = tmp_path / "pair"
    verify = start_verify(tmp_path, str(original), str(port), "--steps", "100000", "-q", "-o", str(out), *LONG)
    done = until_steps(verify, out / "actual")
    code, err = stopped_with(verify, signal.SIGINT)
    assert code == 130, err
    assert "received SIGINT" in err and "Traceback" not in err
    assert until_nothing_survives(tmp_path, within_s=2) == []
    assert_interrupted(out / "actual", "SIGINT", done)
    assert locks_in(out) == [] and not (out / "ref").exists()


def test_sigterm_stops_the_reference_and_its_calibration_running_together(tmp_path):
    """The port runs first; the reference and its calibration then run at once, supervised by threads of their own,
    while only the main thread receives signals: SIGTERM stops both, each marked interrupted with its steps kept."""
    original = long_script(tmp_path)
    port = tmp_path / "long_train_npu.py"
    port.write_text(original.read_text().replace("steps = int(", "steps = 3 or int("))  # ends by itself, well
    out = tmp_path / "pair"
    verify = start_verify(tmp_path, str(original), str(port), "--steps", "100000", "-q", "-o", str(out), *LONG)
    until_steps(verify, out / "ref")
    done = until_steps(verify, out / "calibration")
    code, err = stopped_with(verify, signal.SIGTERM)
    assert code == 143, err
    assert "Traceback" not in err
    assert until_nothing_survives(tmp_path, within_s=2) == []
    assert_interrupted(out / "ref", "SIGTERM", 1)
    assert_interrupted(out / "calibration", "SIGTERM", done)
    assert read_manifest(out / "actual").status == "short" and locks_in(out) == []
    # every run of the pair computed with the same threads: its share of the cores, as two ran at once
    assert len({read_manifest(out / side).threads for side in ("actual", "ref", "calibration")}) == 1


def test_a_step_written_before_its_count_is_counted_when_the_run_is_stopped(tmp_path):
    """Regression (the test above, once in a full CI run): the child was killed after writing a step's losses and
    before its manifest counted the step, so the interrupted run held 28 losses under 'steps_completed: 27'. The
    runner, finalising a run stopped from outside, counts the steps whose losses were written whole."""
    write_manifest(tmp_path, RunManifest(script="train.py", steps_requested=100, steps_completed=2,
                                         status="running"))
    writer = RunWriter(tmp_path)
    writer.append_losses([(step, 0, 1.0, None, 3.5) for step in range(3)])
    writer.close()
    (tmp_path / LOSSES).open("a").write("3,0,0.")  # a row cut short: not a step written whole
    runner._finalise(tmp_path, -signal.SIGTERM, "interrupted", None, 1.0, Stopped(signal.SIGTERM))
    manifest = read_manifest(tmp_path)
    assert (manifest.status, manifest.steps_completed) == ("interrupted", 3)


@pytest.mark.slow
def test_sigterm_stops_every_rank_and_the_launcher(tmp_path):
    """With 2 ranks the manifest stayed `running` and the ranks outlived verify by 5-25 s."""
    out = tmp_path / "run"
    verify = start_verify(tmp_path, "run", str(long_script(tmp_path)), "--nproc-per-node", "2", "--steps", "100000",
                          "-q", "-o", str(out), *LONG, "--ranks")
    done = until_steps(verify, out)
    code, err = stopped_with(verify, signal.SIGTERM)
    assert code == 143, err
    assert until_nothing_survives(tmp_path, within_s=2) == []
    assert_interrupted(out, "SIGTERM", done)
    assert len(read_run(out).ranks) == 2 and locks_in(out) == []


@pytest.mark.slow
def test_ranks_die_with_a_verify_killed_hard(tmp_path):
    """SIGKILL leaves verify no time: the bootstrap dies with it, and each rank with the bootstrap that launched it."""
    out = tmp_path / "run"
    verify = start_verify(tmp_path, "run", str(long_script(tmp_path)), "--nproc-per-node", "2", "--steps", "100000",
                          "-q", "-o", str(out), *LONG, "--ranks")
    until_steps(verify, out)
    code, _ = stopped_with(verify, signal.SIGKILL)
    assert code == -signal.SIGKILL
    assert until_nothing_survives(tmp_path) == []


@pytest.mark.slow
def test_the_timeout_stops_a_setsid_orphan_too(tmp_path):
    script = long_script(tmp_path)

    def timed_out_training(timeout: float, out: Path) -> tuple[int, str]:
        verify = start_verify(tmp_path, "run", str(script), "--steps", "100000", "--timeout", str(timeout), "-q",
                              "-o", str(out), *LONG, "--orphan")
        _, err = verify.communicate(timeout=timeout + 60)  # then verify stops the run: a few seconds
        return verify.returncode, err

    def too_soon(out: Path) -> bool:  # the script starts its orphan before its first step
        return timed_out(out) and read_manifest(out).steps_completed == 0

    (code, err), out, timeout = timed_out_in_the_hang(timed_out_training, tmp_path, too_soon)
    assert code == EXIT_FAILED, err
    assert read_manifest(out).status == "timeout" and read_manifest(out).timeout_s == timeout
    assert until_nothing_survives(tmp_path, within_s=2) == [] and locks_in(out) == []


@pytest.mark.slow
def test_a_script_that_spawns_its_own_ranks_is_refused_under_nproc_per_node_naming_the_option(tmp_path):
    """`verify main.py main_npu.py --nproc-per-node 8` on a script spawning 8 ranks started 64."""
    out = tmp_path / "run"
    verify = start_verify(tmp_path, "run", str(SCRIPTS / "ddp_spawn.py"), "--nproc-per-node", "2", "--steps", "2",
                          "-o", str(out))
    _, err = verify.communicate(timeout=300)
    assert verify.returncode == EXIT_ERROR, err
    assert "the script starts 2 ranks of its own (torch.multiprocessing.spawn)" in " ".join(err.split())
    assert "run it without --nproc-per-node" in " ".join(err.split())
    # torchrun stops the other rank with SIGTERM, which a rank now hears (issue 43): it may end before its manifest
    steps = [rank.manifest.steps_completed for rank in read_run(out).ranks]
    assert steps and set(steps) == {0}


@pytest.mark.slow
def test_a_script_spawning_more_ranks_than_the_machine_holds_is_refused_unless_forced(tmp_path):
    limit, _ = rank_limit()
    script = tmp_path / "ddp_spawn_many.py"
    script.write_text((SCRIPTS / "ddp_spawn.py").read_text().replace("WORLD_SIZE = 2", f"WORLD_SIZE = {limit + 1}"))
    verify = start_verify(tmp_path, "run", str(script), "--steps", "2", "-o", str(tmp_path / "run"))
    _, err = verify.communicate(timeout=300)
    assert verify.returncode == EXIT_ERROR, err
    words = " ".join(err.split())
    assert f"the script starts {limit + 1} ranks of its own" in words and f"more than the {limit}" in words
    assert "add --force" in words and until_nothing_survives(tmp_path, within_s=2) == []



# Issue 43, item 6: a script that saves on SIGTERM and ends, as trainers under a scheduler do.
SAVES_ON_SIGTERM = """
import signal, sys, time
import torch

def save_and_end(signum, frame):
    print(f"handler ran: saving at signal {signum}", flush=True)
    sys.exit(0)

signal.signal(signal.SIGTERM, save_and_end)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(100000):
    optimizer.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    optimizer.step()
    time.sleep(0.2)
"""


@pytest.mark.slow
def test_the_scripts_own_sigterm_handler_runs_when_verify_is_stopped(tmp_path):
    """The child inherited the mask verify holds while it starts a run: SIGTERM waited, unseen, until the SIGKILL 5 s
    later, the script's handler never ran and steps went on meanwhile."""
    script = tmp_path / "saves_on_sigterm.py"
    script.write_text(SAVES_ON_SIGTERM)
    out = tmp_path / "run"
    verify = start_verify(tmp_path, "run", str(script), "--steps", "100000", "-q", "-o", str(out))
    until_steps(verify, out)
    code, err = stopped_with(verify, signal.SIGTERM)
    assert code == 143, err
    assert "handler ran: saving at signal 15" in (out / "output.log").read_text()
    assert_interrupted(out, "SIGTERM", 2)
    assert read_manifest(out).exit_code == 0  # the handler's sys.exit(0) ended the child: no SIGKILL (-9)


@pytest.mark.slow
def test_a_folder_left_by_a_verify_killed_hard_is_reported_as_ended_with_it_and_taken_over(tmp_path):
    """SIGKILL left the lock and the `running` manifest: `report` said running, and the next verify into the folder
    was refused as being written by another verify."""
    out = tmp_path / "run"
    script = long_script(tmp_path)
    verify = start_verify(tmp_path, "run", str(script), "--steps", "100000", "-q", "-o", str(out), *LONG)
    done = until_steps(verify, out)
    assert stopped_with(verify, signal.SIGKILL)[0] == -signal.SIGKILL
    assert until_nothing_survives(tmp_path) == []
    assert read_manifest(out).status == "running" and locks_in(out)  # as verify left it
    report = CliRunner().invoke(app, ["report", str(out)])
    words = " ".join(report.output.split())
    assert report.exit_code == 0 and "status interrupted" in words, words
    assert "ended without closing it (killed by SIGKILL" in words and f"{done} steps completed" in words
    again = start_verify(tmp_path, "run", str(script), "--steps", "2", "-q", "-o", str(out), "--", "2")
    _, err = again.communicate(timeout=STARTED_S)
    assert again.returncode == 0, err
    assert read_manifest(out).status == "ok" and locks_in(out) == []


@pytest.mark.slow
@pytest.mark.parametrize("ending", ["os._exit(0)", "sys.exit(0)"])
def test_a_script_that_ends_its_process_itself_after_two_steps_ended_and_did_not_crash(tmp_path, ending):
    """os._exit(0) after 2 steps left the manifest `running` and the runner called it a crash (exit 1)."""
    script = tmp_path / "ends_itself.py"
    script.write_text((SCRIPTS / "long_train.py").read_text().replace(
        "    time.sleep(0.2)\n", f"    if _ == 1:\n        import os\n        {ending}\n"))
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", str(script), "--steps", "5", "-q", "-o", str(out), "--", "100"])
    manifest = read_manifest(out)
    assert result.exit_code == 0, result.output
    assert (manifest.status, manifest.steps_completed, manifest.exit_code) == ("short", 2, 0), manifest.message
    assert "ended by itself after 2 of 5 steps" in manifest.message
