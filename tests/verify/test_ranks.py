"""Multi-rank runs (issue 21) on real runs: each side as N ranks through torch.distributed.run on the CPU, the
emulations presenting one device a rank and gloo standing in for nccl and hccl; the comparison rank by rank, the
sharding checked at run time, faults stopped with every rank's records kept and no process left behind.

The fixtures are tests/verify/scripts/ddp_torchrun.py (a torchrun-style DDP trainer) and its transfer-mode port;
the broken ports are made from the port by replacing one line. Each run makes 4 steps of a tiny MLP.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from hung_runs import ranks_timed_out_before_their_hang, timed_out, timed_out_in_the_hang
from live_processes import processes_naming
from typer.testing import CliRunner

from verify.cli import app
from verify.cli.pair import route
from verify.launch import process_tree
from verify.record.run_folders import rank_dirs
from verify.record.store import read_run

pytestmark = pytest.mark.slow

SCRIPTS = Path(__file__).resolve().parent / "scripts"
ORIGINAL, PORT = SCRIPTS / "ddp_torchrun.py", SCRIPTS / "ddp_torchrun_npu.py"
ARGS = ["--", "2", "4"]  # 2 epochs of batch 4: 8 steps an epoch on each of 2 ranks
RANKS = ["--nproc-per-node", "2", "--steps", "4", "-q"]


def verify(*args: str | Path) -> tuple[int, str, dict]:
    """`verify ...` in-process: the exit code, the output and summary.json of the -o folder (if written)."""
    argv = [str(arg) for arg in args]
    result = CliRunner().invoke(app, route(argv, typer.main.get_command(app)))
    out = Path(argv[argv.index("-o") + 1])
    summary_file = out / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.is_file() else {}
    return result.exit_code, result.output, summary


@pytest.fixture(scope="module")
def faithful(tmp_path_factory) -> tuple[int, str, dict, Path]:
    """The faithful port against the original, 2 ranks a side, once for the tests that read it."""
    out = tmp_path_factory.mktemp("faithful") / "pair"
    return (*verify(ORIGINAL, PORT, *RANKS, "-o", out, *ARGS), out)


def test_verify_run_launches_ranks_through_torchrun_and_each_writes_its_folder(tmp_path):
    out = tmp_path / "run"
    code, output, _ = verify("run", PORT, *RANKS, "-o", out, *ARGS)
    assert code == 0, output
    assert [folder.name for folder in rank_dirs(out)] == ["rank0", "rank1"]
    run = read_run(out)
    assert run.manifest.status == "ok" and run.manifest.world_size == 2 and run.manifest.nproc_per_node == 2
    assert run.manifest.process_group == {"backend": "hccl", "runs_as": "gloo"}
    assert "2 ranks (hccl run as gloo)" in output.replace("\n", "")
    for rank, rank_run in enumerate(run.ranks):
        assert rank_run.manifest.rank == rank and rank_run.manifest.steps_completed == 4
        assert len(rank_run.losses) == 4 and "c10d.allreduce_" in set(rank_run.ops["op"])
        assert rank_run.manifest.device == "emulated-npu"


def test_every_process_group_call_of_the_frameworks_runs_on_the_emulated_npu(tmp_path):
    """barrier() asked torch for its accelerator, whose C++ hooks the emulated NPU had not registered ("Please
    register PrivateUse1HooksInterface"): every 2-rank Trainer and accelerate run crashed in main_process_first."""
    out = tmp_path / "run"
    code, output, _ = verify("run", SCRIPTS / "process_group_calls.py", "--nproc-per-node", "2", "--steps", "3", "-q",
                             "-o", out)
    assert code == 0, output
    run = read_run(out)
    assert run.manifest.process_group == {"backend": "hccl", "runs_as": "gloo"}
    assert [rank.manifest.steps_completed for rank in run.ranks] == [3, 3]


def test_an_accelerate_script_runs_as_accelerate_launch_runs_it_with_its_options_in_the_environment(tmp_path,
                                                                                                   monkeypatch):
    """`accelerate launch --num_processes 2 --mixed_precision fp16` starts torch.distributed.run with
    ACCELERATE_MIXED_PRECISION=fp16: --nproc-per-node 2 with that variable is the same launch."""
    pytest.importorskip("accelerate")
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")
    out = tmp_path / "run"
    code, output, _ = verify("run", SCRIPTS / "accelerate_ranks_npu.py", "--nproc-per-node", "2", "--steps", "3",
                             "-q", "-o", out)
    assert code == 0, output
    ranks = read_run(out).ranks
    # accelerate's fp16 GradScaler skips its first update while its scale settles, which adds a step, and the script
    # ends after its 4 batches a rank
    assert [rank.manifest.steps_completed for rank in ranks] == [4, 4]
    assert all(rank.manifest.skipped_steps[0] == 0 for rank in ranks)
    assert all("c10d.allreduce_" in set(rank.ops["op"]) for rank in ranks)


LIGHTNING_RANKS = """
import torch
import lightning as L


class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        return torch.nn.functional.mse_loss(self.layer(inputs), targets)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


L.seed_everything(0)
data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True)  # built outside the module, as users do
trainer = L.Trainer(max_steps=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False)
trainer.fit(Regression(), loader)
"""


def test_lightning_rebuilds_a_dataloader_with_its_distributed_sampler_on_two_ranks(tmp_path):
    """On several ranks Lightning rebuilds the script's DataLoader with a DistributedSampler from the arguments its
    __init__'s signature names; verify's DataLoader record replaced __init__ by `(loader, *args, **kwargs)`, and both
    sides of Lightning's transformer example stopped before their first step: "Trying to inject custom `Sampler` into
    the `DataLoader` instance ... The missing attributes are ['loader']"."""
    pytest.importorskip("lightning")
    script = tmp_path / "lightning_ranks.py"
    script.write_text(LIGHTNING_RANKS)
    out = tmp_path / "run"
    code, output, _ = verify("run", script, "--device", "emulated-cuda", "--nproc-per-node", "2", "--steps", "3",
                             "-q", "-o", out)
    assert code == 0, output
    assert [rank.manifest.steps_completed for rank in read_run(out).ranks] == [3, 3]


def broken_port(tmp_path: Path, *replacements: tuple[str, str]) -> Path:
    """The faithful port with lines replaced (a replacement by "" drops the line)."""
    text = PORT.read_text()
    for old, new in replacements:
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / "ddp_torchrun_npu.py"
    path.write_text(text)
    return path


def verify_against_faithful_ref(faithful, port: Path, out: Path) -> tuple[int, str, dict]:
    """A broken port against the faithful pair's reference run (--ref-run: the original runs once)."""
    return verify(ORIGINAL, port, *RANKS, "--ref-run", faithful[3] / "ref", "-o", out, *ARGS)


def test_a_faithful_port_passes_rank_by_rank_with_the_sharding_checked(faithful):
    code, output, summary, out = faithful
    assert code == 0, output
    assert summary["reason"].startswith("PASS: on each of the 2 ranks, loss within")
    assert summary["ranks"]["world_size"] == {"ref": 2, "actual": 2}
    assert summary["ranks"]["sharding"]["passed"] and summary["ranks"]["sharding"]["original_disjoint"]
    assert [reason[:4] for reason in summary["ranks"]["verdicts"]] == ["PASS", "PASS"]
    assert "2 ranks (nccl run as gloo)" in summary["ref"]["title"]
    assert "2 ranks (hccl run as gloo)" in summary["actual"]["title"]
    ops = read_run(out / "actual").ranks[1].ops
    assert "c10d.allreduce_" in set(ops["op"])  # the collectives are op records, compared like any other


def test_a_port_without_its_distributed_sampler_fails_naming_the_sharding_first(faithful, tmp_path):
    port = broken_port(tmp_path, ("    sampler = DistributedSampler(dataset)\n", ""),
                       (", sampler=sampler)", ", shuffle=True)"), ("        sampler.set_epoch(epoch)\n", ""))
    checklist = [{"id": "C7", "title": "Sharding", "status": "Passed", "evidence": ["train.py:30"]}]
    (tmp_path / "ddp_torchrun_npu_report").mkdir()
    (tmp_path / "ddp_torchrun_npu_report" / "checklist.json").write_text(json.dumps(checklist))
    code, output, summary = verify_against_faithful_ref(faithful, port, tmp_path / "out")
    assert code == 1, output
    assert summary["reason"] == (
        "FAIL: rank 1 read the same samples as rank 0 at step 0, where the original's ranks read disjoint shards: "
        "the port has no DistributedSampler (its DataLoader samples with RandomSampler)")
    assert summary["findings"][0]["code"] == "sharding"
    html = (tmp_path / "out" / "report.html").read_text()  # checklist item C7 takes the run-time evidence
    assert "verify (run time): rank 1 read the same samples as rank 0" in html and "Passed" not in html


def test_a_port_without_its_sampler_whose_ranks_each_draw_their_own_data_fails_naming_the_sampler(tmp_path):
    """As pytorch/examples' ddp-tutorial-series draws its dataset unseeded in every rank: no two ranks read one sample,
    so only what each rank read against the original's rank tells the missing sampler."""
    own_data = ("generator = torch.Generator().manual_seed(0)",
                'generator = torch.Generator().manual_seed(int(os.environ["RANK"]))')
    original = tmp_path / "ddp_torchrun.py"
    original.write_text(ORIGINAL.read_text().replace(*own_data))
    port = broken_port(tmp_path, own_data, ("    sampler = DistributedSampler(dataset)\n", ""),
                       (", sampler=sampler)", ")"), ("        sampler.set_epoch(epoch)\n", ""))
    code, output, summary = verify(original, port, *RANKS, "--calibration-runs", "0", "-o", tmp_path / "out", *ARGS)
    assert code == 1, output
    assert summary["reason"] == (
        "FAIL: rank 0 read other samples than the original's rank 0 at step 0: the port has no DistributedSampler "
        "(its DataLoader samples with SequentialSampler)")
    assert summary["findings"][0]["code"] == "sharding"


def test_a_port_that_never_sets_the_samplers_epoch_fails_naming_set_epoch(faithful, tmp_path):
    port = broken_port(tmp_path, ("        sampler.set_epoch(epoch)\n", ""))
    code, output, summary = verify_against_faithful_ref(faithful, port, tmp_path / "out")
    assert code == 1, output
    assert summary["reason"] == (
        "FAIL: at step 2 the port's ranks read again the samples of step 0, where the original's read new ones: the "
        "port does not set the sampler's epoch (set_epoch) as the original does")


def test_a_port_whose_ranks_do_not_all_reduce_fails_naming_it(faithful, tmp_path):
    port = broken_port(tmp_path, ("    model = DistributedDataParallel(model, device_ids=[local_rank])\n", ""))
    code, output, summary = verify_against_faithful_ref(faithful, port, tmp_path / "out")
    assert code == 1, output
    assert summary["reason"].startswith("FAIL: the port's rank 1 holds another gradient")
    assert "the port does not all-reduce its gradients" in summary["reason"]


FAILS = SCRIPTS / "ddp_rank_fails.py"


@pytest.mark.parametrize("hang", ["hang", "hang-deaf"])
def test_a_rank_that_hangs_is_stopped_at_the_timeout_named_with_the_collective_and_nothing_survives(tmp_path, hang):
    """hang-deaf ignores SIGTERM: the launcher cannot stop it, and verify kills the launcher and the rank's own
    session (torchrun gives each rank one) itself."""
    (code, output, _), out, timeout = timed_out_in_the_hang(
        lambda timeout, out: verify("run", FAILS, "--nproc-per-node", "2", "--steps", "5", "--timeout", timeout,
                                    "-q", "-o", out, "--", hang),
        tmp_path, ranks_timed_out_before_their_hang)
    assert code == 1, output
    run = read_run(out)
    assert run.manifest.status == "timeout"
    # stopped within the stop's own bound after the timeout: a grace after SIGTERM, one after SIGKILL, the child's
    # reaping and the log reader's end, each GRACE_S at most (torch's launcher alone would give a deaf rank 30 s)
    assert run.manifest.wall_s < timeout + 5 * process_tree.GRACE_S
    assert run.manifest.message.startswith("rank 1 hung at step 2 outside the collectives the others wait for")
    assert "rank 0 waits in c10d.allreduce_ in Sequential.0 of step 2" in run.manifest.message
    assert [len(rank.losses) for rank in run.ranks] == [2, 2]  # every rank's records up to then
    assert [rank.manifest.status for rank in run.ranks] == ["timeout", "timeout"]
    assert processes_naming(out.resolve()) == []


def test_a_rank_that_crashes_is_named_first_and_nothing_survives(tmp_path):
    out = tmp_path / "run"
    code, output, _ = verify("run", FAILS, "--nproc-per-node", "2", "--steps", "5", "-q",
                             "-o", out, "--", "crash")
    assert code == 1, output
    run = read_run(out)
    assert run.manifest.status == "crashed"
    assert run.manifest.message.startswith("rank 1: RuntimeError: rank 1 fails on purpose (after 2 steps); rank 0 ")
    assert "c10d.allreduce_" in run.manifest.message and "which rank 1 never called" in run.manifest.message
    assert [len(rank.losses) for rank in run.ranks] == [2, 2]
    assert processes_naming(out.resolve()) == []


def test_the_same_crash_on_both_sides_is_the_same_error_under_the_launcher_too(tmp_path):
    """Issue 36 item 6: rank 1 crashes on both sides and rank 0 then fails in gloo, whose message names a port that
    differs between the sides: one behaviour, judged on the steps made, as in one process (exit 2 before)."""
    port = tmp_path / "ddp_rank_fails_npu.py"
    port.write_text(FAILS.read_text())
    code, output, summary = verify(FAILS, port, "--nproc-per-node", "2", "--steps", "5", "-q",
                                   "-o", tmp_path / "pair", "--", "crash")
    assert code == 0, output
    assert "with the same error, RuntimeError: rank 1 fails on purpose" in summary["reason"]
    assert processes_naming((tmp_path / "pair").resolve()) == []


def test_a_port_whose_rank_hangs_fails_naming_the_rank_and_the_collective(tmp_path):
    port = tmp_path / "ddp_rank_fails_npu.py"
    port.write_text(FAILS.read_text().replace("MODE = sys.argv[1]", 'MODE = "hang"'))

    def too_soon(out: Path) -> bool:  # the reference, run after the hung port, has the timeout too, and must end
        return ranks_timed_out_before_their_hang(out / "actual") or timed_out(out / "ref")

    (code, output, summary), out, _ = timed_out_in_the_hang(
        lambda timeout, out: verify(FAILS, port, "--nproc-per-node", "2", "--steps", "4", "--timeout", timeout,
                                    "-q", "-o", out, "--", "none"),
        tmp_path, too_soon)
    assert code == 1, output
    assert summary["reason"].startswith("FAIL: actual run timeout: rank 1 hung at step 2")
    assert "rank 0 waits in c10d.allreduce_" in summary["reason"]
    assert processes_naming(out.resolve()) == []


def test_a_script_that_spawns_its_own_ranks_is_captured_in_every_rank_without_an_option(tmp_path):
    spawner = SCRIPTS / "ddp_spawn.py"
    code, output, summary = verify(spawner, spawner, "--steps", "4", "-q", "-o", tmp_path / "out")
    assert code == 0, output
    assert summary["reason"].startswith("PASS: on each of the 2 ranks")
    run = read_run(tmp_path / "out" / "actual")
    assert run.manifest.world_size == 2 and run.manifest.nproc_per_node == 0
    assert [len(rank.losses) for rank in run.ranks] == [4, 4]
    assert summary["ranks"]["sharding"]["passed"] and summary["ranks"]["sharding"]["original_disjoint"]


def test_a_port_whose_ranks_share_one_seed_fails_naming_the_seed(tmp_path):
    """Batches drawn by random index, each rank's generator seeded with its rank: a port that drops the offset reads
    the same batches on every rank, and the first line says which seed is missing."""
    original = SCRIPTS / "ddp_seeded_batches.py"
    port = tmp_path / "ddp_seeded_batches_npu.py"
    code = original.read_text().replace("seed_offset = rank ", "seed_offset = 0 ")
    port.write_text("import torch_npu\nfrom torch_npu.contrib import transfer_to_npu\n" + code)
    exit_code, output, summary = verify(original, port, *RANKS, "-o", tmp_path / "out", "--", "6")
    assert exit_code == 1, output
    assert summary["reason"].startswith("FAIL: rank 1 read the same samples as rank 0 at step 0"), summary["reason"]
    assert "a seed that differs per rank" in summary["reason"]
