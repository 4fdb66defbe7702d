"""The sharding check reads the input that tells samples apart (verify/compare/sharding.py): a keyword batch
(`model(**batch)`) may come labels first, whose samples are a handful of classes.

Regression (issue 54): accelerate's nlp_example.py on 2 ranks with its train dataloader left out of
accelerator.prepare: both ranks of the port read the whole data, yet the check compared the labels (two fingerprints)
and said each rank "read the samples the original's rank read"."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from verify.compare.findings import FindingCode
from verify.compare.sharding import lead_input, sharding
from verify.record.schema import RunManifest
from verify.record.store import Run

LABELS = ["class-0", "class-1"]


def rank_run(root: Path, rank: int, samples: list[list[str]], loaders: int) -> Run:
    """A rank whose model received, at step s, labels and input_ids of the samples `samples[s]` (keyword order:
    labels first)."""
    rows = []
    for step, read in enumerate(samples):
        labels = [LABELS[int(name.split("-")[1]) % 2] for name in read]
        rows += [dict(step=step, module="Bert", call_index=0, io="in0", shape=str(len(read)),
                      fingerprints=",".join(labels)),
                 dict(step=step, module="Bert", call_index=0, io="in1", shape=f"{len(read)}x8",
                      fingerprints=",".join(read))]
    manifest = RunManifest(status="ok", rank=rank, steps_completed=len(samples),
                           extra={"environment": {"data_loaders": [{"sampler": "RandomSampler"}] * loaders}})
    return Run(root=root / str(rank), manifest=manifest, samples=pd.DataFrame(rows))


def side(root: Path, shards: list[list[list[str]]], loaders: int) -> Run:
    ranks = [rank_run(root, rank, samples, loaders) for rank, samples in enumerate(shards)]
    return Run(root=root, manifest=ranks[0].manifest, samples=ranks[0].samples, ranks=ranks)


def test_ranks_reading_the_whole_data_are_named_though_their_labels_agree(tmp_path):
    sharded = [[["s-0", "s-1"], ["s-4", "s-5"]], [["s-2", "s-3"], ["s-6", "s-7"]]]
    whole = [[["s-0", "s-1"], ["s-2", "s-3"]], [["s-0", "s-1"], ["s-2", "s-3"]]]
    ref, actual = side(tmp_path / "ref", sharded, 4), side(tmp_path / "actual", whole, 3)
    assert lead_input([*ref.ranks, *actual.ranks]) == "in1"
    [finding], evidence = sharding(ref, actual)
    assert finding.code is FindingCode.SHARDING and not evidence["passed"]
    assert finding.message.startswith("rank 1 read the same samples as rank 0 at step 0, where the original's ranks "
                                      "read disjoint shards: the port made 3 DataLoader(s) where the original made 4")


def test_a_faithful_port_reading_the_same_shards_passes(tmp_path):
    sharded = [[["s-0", "s-1"], ["s-4", "s-5"]], [["s-2", "s-3"], ["s-6", "s-7"]]]
    findings, evidence = sharding(side(tmp_path / "ref", sharded, 4), side(tmp_path / "actual", sharded, 4))
    assert findings == [] and evidence["passed"] and evidence["message"].endswith("(disjoint shards)")
