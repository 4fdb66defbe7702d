"""A process group the script destroys stays alive, its gloo threads with it, until the rank's process ends: freed
while the script's function returns (a DistributedDataParallel's reducer its last holder), gloo's destructor joined its
worker threads holding the GIL while a worker waited for the GIL to release an all_gather's tensors, and about one
verify run in five of tests/verify/scripts/rank_dropout.py deadlocked (gdb: ~ProcessGroupGloo in std::thread::join,
pt_gloo_runloop in ~AsyncAllgatherWork taking the GIL)."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from verify.capture import rank_capture


def _threads() -> int:
    """This process's threads: a gloo group has its own (torch 2.4 leaves them unnamed, later ones name them)."""
    return len(os.listdir("/proc/self/task"))


def _gather_and_destroy(store_file: Path) -> None:
    """What a rank's function ends with: an all_gather, then destroy_process_group(), which frees the group at once
    where nothing else holds it (here; in a script, often its DDP model until the function returns)."""
    dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=0, world_size=1)
    gathered = [torch.empty(2)]
    dist.all_gather(gathered, torch.ones(2))
    dist.destroy_process_group()


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="a process's threads are read from /proc")
def test_a_destroyed_group_keeps_its_gloo_threads_until_the_process_ends(tmp_path):
    unhooked, before = dist.distributed_c10d._update_default_pg, _threads()
    with rank_capture.destroyed_groups_kept():
        _gather_and_destroy(tmp_path / "kept")
        gc.collect()
        kept = _threads()
    assert kept > before  # the group lives on: its destructor never runs inside the script
    assert dist.distributed_c10d._update_default_pg is unhooked
    _gather_and_destroy(tmp_path / "freed")  # as torch alone does it: the group and its threads go at once
    gc.collect()
    assert _threads() == kept
