"""Every rank in the reports (issue 37), on real 2-rank runs (torchrun-style, gloo): the op tables carry a rank
column, the terminal shows the rank the verdict names and says where the others are; broadcast, reduce_scatter and
all_gather recorded and compared on every rank; `verify determinism --nproc-per-node`; a hang under --dump off still
names the collective.

The fixture is tests/verify/scripts/ddp_collectives.py (data parallel by hand: rank 0's parameters broadcast, the
gradients reduce_scattered and all_gathered).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import typer
from hung_runs import ranks_timed_out_before_their_hang, timed_out_in_the_hang
from typer.testing import CliRunner

from verify.cli import app
from verify.cli.pair import route
from verify.record.store import read_run

pytestmark = pytest.mark.slow

SCRIPTS = Path(__file__).resolve().parent / "scripts"
COLLECTIVES = SCRIPTS / "ddp_collectives.py"
RANKS = ["--nproc-per-node", "2", "--steps", "4", "-q"]


def verify(*args: str | Path) -> tuple[int, str]:
    argv = [str(arg) for arg in args]
    result = CliRunner().invoke(app, route(argv, typer.main.get_command(app)))
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def without_broadcast(tmp_path_factory) -> tuple[int, str, Path]:
    """A port whose ranks keep their own initial parameters (no broadcast) against the original."""
    folder = tmp_path_factory.mktemp("no_broadcast")
    port = folder / "ddp_collectives_npu.py"
    port.write_text(COLLECTIVES.read_text().replace('if sys.argv[1:] != ["no-broadcast"]:', "if False:"))
    code, output = verify(COLLECTIVES, port, *RANKS, "--calibration-runs", "0", "-o", folder / "out")
    return code, output, folder / "out"


def test_every_rank_is_in_the_op_tables_with_its_collectives(without_broadcast):
    code, output, out = without_broadcast
    assert code == 1, output
    for table in (pd.read_csv(out / "ops.csv"), pd.read_parquet(out / "ops.parquet")):
        assert table.columns[0] == "rank" and sorted(table["rank"].unique()) == [0, 1]
        for rank in (0, 1):
            collectives = set(table.loc[table["rank"] == rank, "ref_op"].dropna())
            assert {"c10d.broadcast_", "c10d.reduce_scatter_", "c10d.allgather_"} <= collectives
    assert "<th>rank</th>" in (out / "report.html").read_text()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ops"]["exact"] == len(pd.read_csv(out / "ops.csv").query("status == 'exact'"))


def test_the_terminal_shows_the_verdicts_rank_and_says_where_the_others_are(without_broadcast):
    code, output, _ = without_broadcast
    line = " ".join(output.split())
    # rank 1's verdict names the cause first: the broadcast only the original computes (a changed operator, before
    # rank 0's first divergent collective), so its ops are the ones shown
    assert "ranks: rank 1's ops shown; every rank's rows are in ops.csv, ops.parquet, ops.xlsx and report.html " \
           "(column rank); past tolerance: rank 0 " in line


def test_a_port_without_the_broadcast_fails_naming_the_parameters_its_ranks_disagree_on(without_broadcast):
    code, output, out = without_broadcast
    reason = json.loads((out / "summary.json").read_text())["reason"]
    assert reason.startswith("FAIL: the port's rank 1 holds another parameter 0.weight than its rank 0 at step 0")
    assert "where the original's ranks agree" in reason


def test_determinism_runs_every_rank_twice(tmp_path):
    code, output = verify("determinism", COLLECTIVES, *RANKS, "-o", tmp_path / "out")
    assert code == 0, output
    record = json.loads((tmp_path / "out" / "determinism.json").read_text())
    assert record["deterministic"] and record["checklist"]["status"] == "Passed"
    assert len(read_run(tmp_path / "out" / "run-1").ranks) == 2


def test_a_hang_under_dump_off_still_names_the_collective(tmp_path):
    (code, output), out, _ = timed_out_in_the_hang(
        lambda timeout, out: verify("run", SCRIPTS / "ddp_rank_fails.py", "--nproc-per-node", "2", "--steps", "5",
                                    "--dump", "off", "--timeout", timeout, "-q", "-o", out, "--", "hang"),
        tmp_path, ranks_timed_out_before_their_hang)
    assert code == 1, output
    message = read_run(out).manifest.message
    assert message.startswith("rank 1 hung at step 2 outside the collectives the others wait for"), message
    assert "rank 0 waits in c10d.allreduce_ of step 2" in message
