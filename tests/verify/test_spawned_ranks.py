"""Scripts that start their own ranks (issue 37): --devices N presents N emulated devices, and every process the
script starts to run its own code (torch.multiprocessing.spawn, multiprocessing.Process of any start method, with a
target or a subclass's run(), torch.distributed.elastic's launches) is captured into its rank folder. A script that
stops for want of devices says so in the error.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from verify.cli import app
from verify.capture.session import _script_and_argv
from verify.cli.pair import route
from verify.errors import VerifyError
from verify.record.run_folders import calibration_dirs, rank_dirs
from verify.record.store import read_run

pytestmark = pytest.mark.slow

SCRIPTS = Path(__file__).resolve().parent / "scripts"
ON_DEVICES = SCRIPTS / "spawn_on_devices.py"
TRANSFER_TO_NPU = "import torch_npu\nfrom torch_npu.contrib import transfer_to_npu\n"  # a port's cuda calls to the NPU


def verify(*args: str | Path) -> tuple[int, str]:
    argv = [str(arg) for arg in args]
    result = CliRunner().invoke(app, route(argv, typer.main.get_command(app)))
    return result.exit_code, result.output


def test_a_script_that_finds_too_few_devices_is_told_its_last_words_and_the_option(tmp_path):
    code, output = verify("run", ON_DEVICES, "--steps", "3", "-q", "-o", tmp_path / "run")
    assert code == 1, output
    message = read_run(tmp_path / "run").manifest.message
    assert message.startswith("the script ended without a step")
    assert "its last output: 'Requires at least 2 GPUs to run, but got 1.'" in message
    assert "--devices N presents N emulated devices" in message
    assert "npu-port:" not in message  # the emulation's banner is not the script's output


def test_devices_n_presents_n_devices_and_the_spawned_ranks_are_captured_until_the_script_spawns_again(tmp_path):
    code, output = verify("run", ON_DEVICES, "--devices", "2", "--steps", "3", "-q", "-o", tmp_path / "run")
    assert code == 0, output
    run = read_run(tmp_path / "run")
    assert run.manifest.status == "ok" and run.manifest.extra["devices"] == 2
    assert [(rank.manifest.rank, len(rank.losses)) for rank in run.ranks] == [(0, 3), (1, 3)]
    # the second demo's spawn ended the script: three processes started, the script and its first two ranks
    log = (tmp_path / "run" / "output.log").read_text()
    assert log.count("cuda calls run on the CPU") == 3


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_every_process_the_script_starts_is_captured_whatever_its_start_method(tmp_path, start_method):
    code, output = verify("run", SCRIPTS / "process_workers.py", "--steps", "3", "-q", "-o", tmp_path / "run",
                          "--", start_method)
    assert code == 0, output
    run = read_run(tmp_path / "run")
    assert [folder.name for folder in rank_dirs(tmp_path / "run")] == ["rank0", "rank1"]
    losses = [list(rank.losses["loss"]) for rank in run.ranks]
    assert [len(rank_losses) for rank_losses in losses] == [3, 3] and losses[0] != losses[1]  # seeded by rank
    assert json.loads((tmp_path / "run" / "rank1" / "manifest.json").read_text())["status"] == "ok"


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_process_subclass_that_overrides_run_is_captured_in_every_rank(tmp_path, start_method):
    """`class Worker(mp.Process): def run(self)` has no target: verify captured only the main process, which
    trains nothing (no steps)."""
    code, output = verify("run", SCRIPTS / "process_subclass.py", "--devices", "2", "--steps", "3", "-q", "-o",
                          tmp_path / "run", "--", start_method)
    assert code == 0, output
    run = read_run(tmp_path / "run")
    assert [(rank.manifest.rank, rank.manifest.world_size, len(rank.losses)) for rank in run.ranks] == [
        (0, 2, 3), (1, 2, 3)]
    assert run.ranks[0].manifest.process_group["backend"] == "gloo"


@pytest.mark.parametrize("launch", ["launch", "run"])
def test_ranks_an_elastic_launch_in_the_script_starts_are_captured_in_every_rank(tmp_path, launch):
    """elastic_launch on a function of the script, torch.distributed.run.main on the script itself: verify captured
    only the launching process. Two of the script's three steps: a function's rank that verify stops returns, for
    elastic's agent waits for its return value (it waited until the run's timeout)."""
    code, output = verify("run", SCRIPTS / "elastic_launch.py", "--devices", "2", "--steps", "2", "-q", "-o",
                          tmp_path / "run", "--", launch)
    assert code == 0, output
    run = read_run(tmp_path / "run")
    assert run.manifest.status == "ok", run.manifest.message
    assert [(rank.manifest.rank, rank.manifest.world_size, len(rank.losses)) for rank in run.ranks] == [
        (0, 2, 2), (1, 2, 2)]


def test_an_elastic_launch_of_a_module_is_refused_naming_what_verify_captures():
    with pytest.raises(VerifyError, match="launches ranks that run 'python -u -m trainer': verify captures ranks"):
        _script_and_argv("python", ("-u", "-m", "trainer"))
    assert _script_and_argv("/usr/bin/python3", ("-u", "train.py", "--lr", 1)) == [
        str(Path("train.py").resolve()), "--lr", "1"]


def test_dataloader_workers_are_not_ranks(tmp_path):
    code, output = verify("run", SCRIPTS / "dataloader_workers.py", "--steps", "2", "-q", "-o", tmp_path / "run")
    assert code == 0, output
    assert rank_dirs(tmp_path / "run") == []


def test_a_pair_of_scripts_that_spawn_at_a_fixed_port_runs_the_reference_and_its_calibration_in_turn(tmp_path):
    """At once, the reference's and its calibration run's ranks met at the script's one MASTER_PORT and joined one
    process group (pytorch/examples' ddp main.py crashed with 'Connection closed by peer')."""
    script = tmp_path / "fixed_port.py"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    script.write_text(ON_DEVICES.read_text().replace("(RANKS, free_port())", f"(RANKS, {str(port)!r})"))
    ported = tmp_path / "fixed_port_npu.py"
    ported.write_text(f"{TRANSFER_TO_NPU}{script.read_text()}")
    code, output = verify(script, ported, "--devices", "2", "--steps", "3", "-q", "-o", tmp_path / "out")
    assert code == 0, output
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["reason"].startswith("PASS: on each of the 2 ranks"), summary["reason"]
    calibration, = calibration_dirs(tmp_path / "out" / "ref")
    assert len(rank_dirs(calibration)) == 2


def test_each_rank_starts_from_its_own_seed_so_a_port_without_ddp_fails_on_its_gradients(tmp_path):
    """verify seeded every rank alike: a script that seeds nothing drew the same data on each rank, so ranks that
    never all-reduced agreed all the same and a port without DDP passed. Each rank now gets the run's seed + its
    rank."""
    script = SCRIPTS / "spawn_unseeded.py"
    port = tmp_path / "spawn_unseeded_npu.py"
    port.write_text(script.read_text().replace('sys.argv[1:] != ["no-ddp"]', "False"))
    code, output = verify(script, port, "--steps", "2", "--calibration-runs", "0", "-q", "-o", tmp_path / "out")
    assert code == 1, output
    reason = json.loads((tmp_path / "out" / "summary.json").read_text())["reason"]
    assert reason.startswith("FAIL: the port's rank 1 holds another gradient"), reason
    assert "the port does not all-reduce its gradients" in reason


@pytest.mark.parametrize(("seeding", "same_masks"), [("per-rank", False), ("alike", True)])
def test_the_keyed_dropout_masks_follow_the_scripts_seeding_per_rank(tmp_path, seeding, same_masks):
    """The keyed streams were keyed by the run's seed alone: ranks the script seeded torch.manual_seed(seed + rank)
    dropped the same units on every rank under verify, and other units without it. They follow the script's seed."""
    script = SCRIPTS / "rank_dropout.py"
    for _ in range(4):  # the plain run's ranks meet at a probed port, which another test's ranks may take meanwhile;
        # and torch alone aborts a rank now and then as it frees the gloo group at exit (verify keeps it: rank_capture)
        plain = subprocess.run([sys.executable, script, seeding, tmp_path / "plain.json"], capture_output=True,
                               text=True)
        if plain.returncode == 0:
            break
    assert plain.returncode == 0, plain.stderr[-3000:]
    # once deadlocked about 1 run in 5, freeing the destroyed group at the end of train(): test_destroyed_groups.py
    code, output = verify("run", script, "--steps", "3", "-q", "-o", tmp_path / "run", "--", seeding,
                          tmp_path / "verify.json")
    assert code == 0, output
    for run in ("plain", "verify"):
        assert json.loads((tmp_path / f"{run}.json").read_text())["same_masks"] is same_masks, run
    assert read_run(tmp_path / "run").ranks[1].manifest.random_keyed_by_tag


def test_spawned_ranks_of_a_gpu_script_that_imports_init_process_group_by_name_run_nccl_as_gloo(tmp_path):
    """pytorch/examples' DDP tutorial (multigpu.py) imports init_process_group by name: its spawned ranks imported it
    before verify set the emulated CUDA up in them, and init_process_group("nccl") crashed every rank ("Distributed
    package doesn't have NCCL built in"). The device is set up before the rank imports the script."""
    code, output = verify("run", SCRIPTS / "spawn_nccl_by_name.py", "--devices", "2", "--steps", "3", "-q",
                          "-o", tmp_path / "run")
    assert code == 0, output
    assert "2 ranks (nccl run as gloo)" in " ".join(output.split())
    run = read_run(tmp_path / "run")
    assert [rank.manifest.process_group for rank in run.ranks] == [{"backend": "nccl", "runs_as": "gloo"}] * 2
    assert [len(rank.losses) for rank in run.ranks] == [3, 3]


HOGWILD = SCRIPTS / "hogwild.py"


@pytest.fixture(scope="module")
def hogwild(tmp_path_factory) -> tuple[int, str, Path]:
    out = tmp_path_factory.mktemp("hogwild") / "out"
    return (*verify(HOGWILD, HOGWILD, "--steps", "6", "-q", "-o", out), out)


def test_hogwild_workers_are_captured_and_the_verdict_says_their_updates_race(hogwild):
    code, output, out = hogwild
    assert code == 0, output
    for side in ("ref", "actual"):
        run = read_run(out / side)
        assert [len(rank.losses) for rank in run.ranks] == [6, 6]
        assert all(rank.manifest.extra["model"] == {"class": "Net", "parameters": 387, "shared_memory": True}
                   for rank in run.ranks)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["reason"].startswith("PASS: on each of the 2 ranks, loss within ")
    assert "update one model's parameters in shared memory without locks (hogwild): their updates race" in \
        summary["reason"]
    assert summary["first_divergent"] is None  # never an op, least of all one of the main process's test pass
    assert "data read by each rank (run time): each of the port's 2 ranks read the samples the original's rank read" \
        in " ".join(summary["notes"])


def test_a_hogwild_port_whose_workers_shuffle_alike_fails_on_the_data_they_read(tmp_path):
    port = tmp_path / "hogwild_npu.py"
    port.write_text(HOGWILD.read_text().replace("torch.manual_seed(1 + rank)", "torch.manual_seed(1)"))
    code, output = verify(HOGWILD, port, "--steps", "4", "--calibration-runs", "0", "-q", "-o", tmp_path / "out")
    assert code == 1, output
    reason = json.loads((tmp_path / "out" / "summary.json").read_text())["reason"]
    assert reason.startswith("FAIL: rank 1 read"), reason
