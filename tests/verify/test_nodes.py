"""verify across machines (verify/launch/nodes.py): two verify processes on this machine stand for two nodes, meeting at
a rendezvous over loopback, each presenting its own emulated devices, writing one shared -o.

The scripts are tests/verify/scripts/ddp_torchrun.py and its transfer-mode port, as 2 nodes of 1 rank each.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from live_processes import processes_naming

from verify.launch.nodes import asked
from verify.errors import VerifyError
from verify.record.run_folders import REF_UNDER_AUTOCAST, node_dir, rank_dirs
from verify.record.schema import DEFAULT_JOIN_TIMEOUT_S
from verify.record.store import read_run

SCRIPTS = Path(__file__).resolve().parent / "scripts"
ORIGINAL, PORT = SCRIPTS / "ddp_torchrun.py", SCRIPTS / "ddp_torchrun_npu.py"
ARGS = ["--", "2", "4"]  # 2 epochs of batch 4 on 16 samples: 2 steps an epoch on each of 2 ranks
# verify's default --rdzv-timeout (DEFAULT_JOIN_TIMEOUT_S): every wait for the other node (its join, node 0's
# comparison of a pair) has room on a busy machine too
NODE = ["--nproc-per-node", "1", "--nnodes", "2", "--steps", "4", "-q"]
STARTED_S = 300  # far beyond what both nodes take to start torch and make a step, on a busy machine too
ROOT = Path(__file__).resolve().parents[2]


def free_port(count: int = 1) -> int:
    """A port on loopback free with the `count` - 1 after it (a pair's sides take one each)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if port + count < 65536 and all(_free(port + offset) for offset in range(1, count)):
            return port
    raise RuntimeError("no free ports on loopback")


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def start_node(node: int, port: int, *args: str | Path, cwd: Path | None = None) -> subprocess.Popen:
    """`verify ARGS --node-rank NODE --rdzv-endpoint 127.0.0.1:PORT [-- SCRIPT ARGS]` in a process of its own, as on
    another machine, in `cwd` (default: this one's)."""
    words = [str(arg) for arg in args]
    split = words.index("--") if "--" in words else len(words)
    command = [sys.executable, "-m", "verify", *words[:split], "--node-rank", str(node),
               "--rdzv-endpoint", f"127.0.0.1:{port}", *words[split:]]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "COLUMNS": "300"}  # lines whole
    return subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def two_nodes(*args: str | Path, ports: int = 1, cwd: Path | None = None) -> list[tuple[int, str]]:
    """Both nodes of a run to their ends: each one's exit code and output."""
    port = free_port(ports)
    nodes = [start_node(node, port, *args, cwd=cwd) for node in (0, 1)]
    return [(node.wait(timeout=600), node.stdout.read()) for node in nodes]


@pytest.mark.slow
def test_two_nodes_meet_at_the_rendezvous_and_write_one_run_each_rank_naming_its_node(tmp_path):
    out = tmp_path / "run"
    (code0, output0), (code1, output1) = two_nodes("run", PORT, *NODE, "-o", out, *ARGS)
    assert code0 == 0 and code1 == 0, output0 + output1
    run = read_run(out)
    assert run.manifest.status == "ok" and run.manifest.world_size == 2
    assert run.manifest.message == "ran the 4 requested steps on each of 2 ranks"
    assert run.manifest.ranks_words == ", 2 ranks on 2 nodes (hccl run as gloo)"
    assert [rank.manifest.rank for rank in run.ranks] == [0, 1]
    assert sorted(rank.manifest.node for rank in run.ranks) == [0, 1]  # one rank a node, whichever rank it got
    assert all(rank.manifest.steps_completed == 4 and "c10d.allreduce_" in set(rank.ops["op"]) for rank in run.ranks)
    for node in (0, 1):  # each node's own log and manifest, which no other node writes
        manifest = json.loads((node_dir(out, node) / "manifest.json").read_text())
        assert manifest["node"] == node and manifest["status"] == "ok"
        assert (node_dir(out, node) / "output.log").is_file()
    assert f"run dir     {out}" in output1  # every node shows the whole run


@pytest.mark.slow
@pytest.mark.parametrize("stop, words", [(signal.SIGTERM, "was stopped"),
                                         (signal.SIGKILL, "died: its verify (process ")])
def test_killing_one_nodes_verify_ends_the_other_with_exit_2_naming_it_and_nothing_survives(tmp_path, stop, words):
    """SIGKILL leaves node 1's manifest `running`: its lock, naming a process gone, tells node 0 not to wait for it."""
    out = tmp_path / "run"
    port = free_port()
    script = Path(shutil.copy(SCRIPTS / "long_train.py", tmp_path))  # every process it starts names tmp_path
    args = ["run", script, "--nproc-per-node", "1", "--nnodes", "2", "-q", "-o", out, "--", "100000", "--ranks"]
    node0, node1 = (start_node(node, port, *args) for node in (0, 1))
    deadline = time.monotonic() + STARTED_S
    while not len(rank_dirs(out)) == 2 or not all((folder / "losses.csv").is_file() for folder in rank_dirs(out)):
        assert time.monotonic() < deadline and node0.poll() is None, node0.stdout.read()
        time.sleep(0.5)
    killed = time.monotonic()
    node1.send_signal(stop)
    code = node0.wait(timeout=2 * DEFAULT_JOIN_TIMEOUT_S)
    output = node0.stdout.read()
    assert code == 2, output
    assert "node 1 (ranks " in output and words in output, output
    # node 0 knew at once (a peer gone, its verify's word or its lock): it waited out no rendezvous timeout
    assert time.monotonic() - killed < DEFAULT_JOIN_TIMEOUT_S
    node1.wait(timeout=STARTED_S)
    assert not processes_naming(tmp_path)


def test_nodes_come_from_slurm_where_the_options_leave_them_out(tmp_path):
    slurm = {"SLURM_NNODES": "4", "SLURM_NODEID": "2", "SLURM_JOB_ID": "77", "MASTER_ADDR": "head",
             "MASTER_PORT": "29400"}
    nodes = asked(None, None, None, None, "c10d", None, tmp_path / "out", slurm)
    assert (nodes.nnodes, nodes.node_rank, nodes.endpoint, nodes.rdzv_id) == (4, 2, "head:29400", "77")
    assert asked(None, None, None, None, "c10d", None, None, {}) is None  # this machine alone
    assert asked(2, 1, "h:1", None, "c10d", 5, tmp_path / "out", {}).rdzv_id == "out"  # the -o every node shares
    with pytest.raises(VerifyError, match="--rdzv-endpoint must be HOST:PORT"):
        asked(2, 1, None, None, "c10d", None, tmp_path, {})
    with pytest.raises(VerifyError, match="--node-rank must be given, from 0 to 1"):
        asked(2, None, "h:1", None, "c10d", None, tmp_path, {})
    with pytest.raises(VerifyError, match="needs -o"):
        asked(2, 0, "h:1", None, "c10d", None, None, {})


@pytest.mark.slow
def test_a_faithful_port_passes_across_two_nodes(tmp_path):
    out = tmp_path / "pair"
    (code0, output0), (code1, output1) = two_nodes(ORIGINAL, PORT, *NODE, "-o", out, *ARGS, ports=3)
    assert code0 == 0 and code1 == 0, output0 + output1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["reason"].startswith("PASS: on each of the 2 ranks, loss within"), summary["reason"]
    assert summary["ranks"]["sharding"]["passed"] and summary["ranks"]["sharding"]["original_disjoint"]
    assert "node 1, actual: ok" in output1 and "node 0 compares the runs" in output1


@pytest.fixture(scope="module")
def unsharded(tmp_path_factory) -> tuple[Path, int, str]:
    """A pair across 2 nodes whose port drops its DistributedSampler: its folder, node 0's exit code and output."""
    folder = tmp_path_factory.mktemp("unsharded")
    port = folder / "ddp_torchrun_npu.py"
    text = PORT.read_text()
    for old, new in (("    sampler = DistributedSampler(dataset)\n", ""), (", sampler=sampler)", ", shuffle=True)"),
                     ("        sampler.set_epoch(epoch)\n", "")):
        text = text.replace(old, new)
    port.write_text(text)
    (code0, output0), _ = two_nodes(ORIGINAL, port, *NODE, "-o", folder / "pair", *ARGS, ports=3)
    return folder / "pair", code0, output0


def _nodes(run: Path) -> dict[int, int]:
    """rank -> node, as each rank's manifest says (the rendezvous, not --node-rank, numbers the ranks)."""
    return {rank.manifest.rank: rank.manifest.node for rank in read_run(run).ranks}


@pytest.mark.slow
def test_a_port_without_its_sampler_fails_across_two_nodes_naming_the_sharding_and_the_ranks_nodes(unsharded):
    out, code, output = unsharded
    assert code == 1, output
    summary = json.loads((out / "summary.json").read_text())
    nodes = _nodes(out / "actual")
    assert summary["reason"].startswith(f"FAIL: rank 1 (node {nodes[1]}) read the same samples as rank 0 (node "
                                        f"{nodes[0]}) at step 0"), summary["reason"]
    assert summary["findings"][0]["code"] == "sharding"


@pytest.mark.slow
def test_the_reports_show_each_rank_by_the_node_its_manifest_names(unsharded):
    out, _, output = unsharded
    nodes = _nodes(out / "actual")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ranks"]["nodes"] == {side: {str(node): [rank] for rank, node in sorted(
        _nodes(out / side).items(), key=lambda item: item[1])} for side in ("ref", "actual")}  # one rank a node
    shown = summary["ranks"]["shown_rank"]
    assert all(f["message"].startswith(f"rank {shown} (node {nodes[shown]}): ") for f in summary["findings"][1:])
    assert f"ranks: rank {shown} (node {nodes[shown]})'s ops shown" in output
    assert "past tolerance: node 0: rank " in output and "; node 1: rank " in output, output
    assert [f"rank {rank} (node {nodes[rank]}): FAIL" in output for rank in (0, 1)] == [True, True]
    ops = pd.read_csv(out / "ops.csv", usecols=["rank", "node"]).drop_duplicates()
    assert dict(zip(ops["rank"], ops["node"])) == nodes
    assert "<th>rank</th><th>node</th>" in (out / "report.html").read_text()


@pytest.mark.slow
def test_a_reference_that_crashes_under_the_ports_autocast_runs_again_as_written_on_every_node(tmp_path):
    """The port computes its forward under fp16 autocast and its binary cross entropy outside it; the reference,
    under the port's autocast, computes it under autocast, which refuses it. Node 0 alone sets that run aside (two
    nodes renaming one folder: the other never read its manifest) and every node runs the reference again, as
    written, once the rename is made."""
    loss = "            loss = torch.nn.functional.binary_cross_entropy_with_logits(model(inputs), targets)\n"
    original, port = tmp_path / "bce.py", tmp_path / "bce_npu.py"
    original.write_text(ORIGINAL.read_text().replace(
        loss, "            loss = torch.nn.functional.binary_cross_entropy(torch.sigmoid(model(inputs)), targets)\n"))
    port.write_text(PORT.read_text().replace(loss, (
        "            with torch.autocast(device_type='cuda', dtype=torch.float16):\n"
        "                logits = model(inputs)\n"
        "            loss = torch.nn.functional.binary_cross_entropy(torch.sigmoid(logits.float()), targets)\n")))
    out = tmp_path / "pair"
    (code0, output0), (code1, output1) = two_nodes(original, port, *NODE, "-o", out, *ARGS, ports=3)
    assert code0 == 0 and code1 == 0, output0 + output1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["pair"]["mode"] == "amp-vs-fp32-unmatched", summary["pair"]
    assert read_run(out / REF_UNDER_AUTOCAST).manifest.status == "crashed"
    assert read_run(out / "ref").manifest.autocast == "" and len(read_run(out / "ref").ranks) == 2
    assert "node 1, ref: ok" in output1 and "node 1, calibration: ok" in output1, output1


def _trainer_bench():
    """tests/perf/bench_trainer_pair.py: its tiny Trainer project (a GPT-2 of 2 layers, local text, no datasets)."""
    path = Path(__file__).parents[1] / "perf" / "bench_trainer_pair.py"
    spec = importlib.util.spec_from_file_location("bench_trainer_pair", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_a_trainer_port_passes_on_two_nodes_of_two_ranks_each_rank_reading_its_own_shard(tmp_path, monkeypatch):
    """transformers' Trainer sets itself up from torchrun's variables (LOCAL_RANK, RANK, WORLD_SIZE,
    LOCAL_WORLD_SIZE): on node 1 its ranks are 2 and 3 of 4, whose batches are none of node 0's."""
    pytest.importorskip("transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    original, port = _trainer_bench().write_project(tmp_path)
    options = ["--nproc-per-node", "2", "--devices", "2", "--nnodes", "2", "--steps", "3", "-q"]
    (code0, output0), (code1, output1) = two_nodes(original.name, port.name, *options, "-o", "pair", ports=3,
                                                   cwd=tmp_path)
    assert code0 == 0 and code1 == 0, output0 + output1
    summary = json.loads((tmp_path / "pair" / "summary.json").read_text())
    assert summary["reason"].startswith("PASS: on each of the 4 ranks, loss within"), summary["reason"]
    assert sorted(map(len, summary["ranks"]["nodes"]["actual"].values())) == [2, 2]
    first_losses = {rank.losses["loss"].iloc[0] for rank in read_run(tmp_path / "pair" / "ref").ranks}
    assert len(first_losses) == 4  # 4 shards of the data, not node 1 reading node 0's
