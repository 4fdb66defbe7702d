"""A run across several machines (nodes): torchrun's multi-node options, read once, and the wait for the other nodes
once this node's ranks ended (the record of the nodes, which the child launches its ranks with, is
verify/record/schema.py's Nodes).

`--nnodes N --node-rank K --rdzv-endpoint HOST:PORT [--rdzv-id ID] [--rdzv-backend c10d] [--rdzv-timeout S]` on
each node, with the same -o on a filesystem every node sees: each node's verify runs torch.distributed.run with these
options (its own c10d rendezvous: no launcher or store of verify's), whose ranks write RUN/rankR/, R their global
rank; each node keeps its own log and manifest in RUN/node-K/ (verify/record/run_folders.py). Under Slurm, N and K
default to SLURM_NNODES and SLURM_NODEID, the endpoint to MASTER_ADDR:MASTER_PORT (what a batch script exports for
torchrun), the id to SLURM_JOB_ID; elsewhere the id defaults to the -o folder's name, which every node shares.

Sides run at once (a pair's reference, port and calibration runs) each get a rendezvous of their own (`for_side`):
the id takes the side's name, and the port the side's number. Their ids alone would let them share one c10d store,
but the store lives in the agent that hosts it (the first to bind the endpoint's port), which ends with its own side:
a side still running would lose its store. So a pair uses PORT, PORT+1, ... (one a side).

A node that dies, or never joins: the rendezvous fails after `join_timeout` (torch's rendezvous), a rank whose peer
died fails in its collective; then `gather` waits at most `join_timeout` for every node's manifest to say how its
ranks ended, and names the nodes that never did (NodeLost, exit 2); not at all for a node whose verify's lock names a
process of this machine that is gone (SIGKILL left its manifest `running`: run_folders.writer_gone).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from verify.errors import RunDirError, VerifyError, VerifyFailure
from verify.launch import rank_outcome
from verify.record import run_folders
from verify.record.schema import DEFAULT_JOIN_TIMEOUT_S, LOG, MANIFEST, RDZV_BACKENDS, Nodes, RunManifest, Status
from verify.record.store import read_last_collective, read_manifest, write_manifest

_POLL_S = 0.5


class NodeLost(VerifyFailure):
    """Another node of the run died, was stopped, or never joined: exit 2, naming it and its ranks."""


def asked(nnodes: int | None, node_rank: int | None, endpoint: str | None, rdzv_id: str | None, backend: str,
          join_timeout: float | None, out: Path | None, environ: Mapping[str, str] = os.environ) -> Nodes | None:
    """The nodes the options ask for, Slurm's variables filling what they leave out; None for a run on this machine
    alone (one node). VerifyError naming the option that is missing or wrong."""
    nnodes = nnodes if nnodes is not None else _slurm_int(environ, "SLURM_NNODES", 1)
    if nnodes <= 1:
        if node_rank or endpoint:
            raise VerifyError("--node-rank and --rdzv-endpoint need --nnodes 2 or more")
        return None
    node_rank = node_rank if node_rank is not None else _slurm_int(environ, "SLURM_NODEID", None)
    if node_rank is None or not 0 <= node_rank < nnodes:
        raise VerifyError(f"--node-rank must be given, from 0 to {nnodes - 1}, for a run of {nnodes} nodes")
    if endpoint is None and environ.get("MASTER_ADDR") and environ.get("MASTER_PORT"):
        endpoint = f"{environ['MASTER_ADDR']}:{environ['MASTER_PORT']}"
    host, _, port = (endpoint or "").rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise VerifyError("--rdzv-endpoint must be HOST:PORT, the same on every node (a machine every node reaches, "
                          "and a free port there)")
    if out is None:
        raise VerifyError(f"a run of {nnodes} nodes needs -o: one folder every node sees (a shared filesystem), the "
                          "same on every node")
    if backend not in RDZV_BACKENDS:
        raise VerifyError(f"--rdzv-backend must be one of {', '.join(RDZV_BACKENDS)}")
    if join_timeout is not None and join_timeout <= 0:
        raise VerifyError("--rdzv-timeout must be more than 0 seconds")
    return Nodes(nnodes=nnodes, node_rank=node_rank, endpoint=endpoint, backend=backend,
                 rdzv_id=rdzv_id or environ.get("SLURM_JOB_ID") or Path(out).resolve().name,
                 join_timeout=DEFAULT_JOIN_TIMEOUT_S if join_timeout is None else join_timeout)


def _slurm_int(environ: Mapping[str, str], name: str, default: int | None) -> int | None:
    value = environ.get(name, "")
    return int(value) if value.isdigit() else default


def node_manifests(run_dir: Path, nodes: Nodes) -> dict[int, RunManifest | None]:
    """Each node's manifest in its folder of the run (None where a node has written none yet)."""
    found: dict[int, RunManifest | None] = {}
    for node in range(nodes.nnodes):
        try:
            found[node] = read_manifest(run_folders.node_dir(run_dir, node))
        except RunDirError:
            found[node] = None
    return found


def gather(run_dir: Path, nodes: Nodes, wait: bool = True) -> dict[int, RunManifest]:
    """Every node's final manifest, waited for at most the rendezvous timeout (not at all without `wait`); NodeLost
    naming the nodes that never ended, never started, or whose verify was stopped (their ranks did not end by
    themselves)."""
    deadline = time.monotonic() + (nodes.join_timeout if wait else 0)
    while True:
        found = node_manifests(run_dir, nodes)
        pending = [node for node, m in found.items() if m is None or m.status == Status.RUNNING.value]
        if all(_writer_gone(run_dir, node) for node in pending) or time.monotonic() > deadline:
            break  # every node ended, or those still running can never end (a writer gone: no wait for it)
        time.sleep(_POLL_S)
    lost = [_lost_words(run_dir, node, manifest, nodes) for node, manifest in found.items()
            if node != nodes.node_rank and (manifest is None or manifest.status in _LOST)]
    if lost:
        raise NodeLost(f"{run_dir}: {'; '.join(lost)}")
    return found  # type: ignore[return-value]


_LOST = (Status.RUNNING.value, Status.INTERRUPTED.value)


def _lost_words(run_dir: Path, node: int, manifest: RunManifest | None, nodes: Nodes) -> str:
    if manifest is None:
        return (f"node {node} never joined: no verify with --node-rank {node} wrote its folder within "
                f"{nodes.join_timeout:g} s (the rendezvous at {nodes.endpoint}, id {nodes.rdzv_id})")
    ranks = ", ".join(str(read_manifest(folder).rank) for folder in rank_dirs_of(run_dir, node)) or "none started"
    if manifest.status == Status.RUNNING.value:
        return f"node {node} (ranks {ranks}) died: " + (_writer_gone(run_dir, node) or (
            f"its verify did not say how its ranks ended within {nodes.join_timeout:g} s of this node's end"))
    return f"node {node} (ranks {ranks}) was stopped: {manifest.message}"


def _writer_gone(run_dir: Path, node: int) -> str:
    """Why node `node`'s verify can never end its manifest (its lock names a process of this machine that is gone:
    killed by SIGKILL), or "" (alive, or on another machine: only the timeout tells)."""
    return run_folders.writer_gone(run_folders.node_dir(run_dir, node))


def rank_dirs_of(run_dir: Path, node: int) -> list[Path]:
    """The folders of the ranks node `node` ran, by rank (their manifests name their node)."""
    return [folder for folder in run_folders.rank_dirs(run_dir) if _node_of(folder) == node]


def _node_of(rank_folder: Path) -> int | None:
    try:
        return read_manifest(rank_folder).node
    except RunDirError:
        return None  # a rank killed before it wrote its manifest: on no node known


def joined(run_dir: Path, nodes: Nodes) -> Path:
    """The run directory once every node's ranks ended and node 0 wrote the run's manifest from every rank's (another
    node waits for it, as long as the rendezvous timeout): every node then reads the same run (a pair decides its
    next side from it). NodeLost where another node never joined, died or was stopped, or where this node's ranks
    never started (the rendezvous failed)."""
    own = run_folders.node_dir(run_dir, nodes.node_rank)
    started = bool(rank_dirs_of(run_dir, nodes.node_rank))
    gather(run_dir, nodes, wait=started)
    if not started:
        raise NodeLost(f"{run_dir}: the rendezvous at {nodes.endpoint} (id {nodes.rdzv_id}) started no rank on node "
                       f"{nodes.node_rank} within {nodes.join_timeout:g} s: see {own / LOG}")
    if nodes.node_rank == 0:
        folders = run_folders.rank_dirs(run_dir)
        mine = read_manifest(own)
        run = rank_outcome.run_manifest(mine, [read_manifest(folder) for folder in folders],
                                        [read_last_collective(folder) for folder in folders])
        write_manifest(run_dir, replace(run, node=0, working_folder=mine.working_folder))
        return run_dir
    if not _within(nodes.join_timeout, (run_dir / MANIFEST).is_file):
        raise NodeLost(f"{run_dir}: node 0 did not write the run's {MANIFEST} within {nodes.join_timeout:g} s of "
                       "every node's end (its verify was stopped, or cannot see this folder)")
    return run_dir


def _within(timeout: float, done: Callable[[], bool]) -> bool:
    """Whether `done` came true within `timeout` seconds (polled)."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(_POLL_S)
    return True


def changed_once(pair_dir: Path, nodes: Nodes | None, change: str, make: Callable[[], Any],
                 made: Path | None = None) -> None:
    """A change to a pair's folder that every node decides alike, from the runs node 0 wrote (verify/pair/run.py:
    runs removed, a reference renamed before it runs again in its place): on one machine made at once; across
    machines by node 0 alone, once every other node has said it read those runs (a file `change` in its folder of
    the pair): two nodes removing one folder fail each other, and a node still reading a run would find it gone. The
    other nodes go on once `made` exists, where they write next where the change made room. NodeLost where a node
    does not say so, or node 0 does not make it, within the rendezvous timeout."""
    if nodes is None:
        make()
        return
    if nodes.node_rank:
        (run_folders.node_dir(pair_dir, nodes.node_rank) / change).touch()
        if made is not None and not _within(nodes.join_timeout, made.exists):
            raise NodeLost(f"{pair_dir}: node 0 did not make {made.name} ({change}) within {nodes.join_timeout:g} s "
                           "(its verify was stopped, or cannot see this folder)")
        return
    def said(node: int) -> bool:
        return (run_folders.node_dir(pair_dir, node) / change).exists()
    others = range(1, nodes.nnodes)
    _within(nodes.join_timeout, lambda: all(said(node) or _writer_gone(pair_dir, node) for node in others))
    if silent := [str(node) for node in others if not said(node)]:
        raise NodeLost(f"{pair_dir}: node {', '.join(silent)} did not say it read the runs within "
                       f"{nodes.join_timeout:g} s ({change}): its verify died, was stopped, or cannot see this folder")
    make()
