"""Directory listings in one order on both sides (verify/capture/listing_order.py): a port that lists a dataset's
files sorted, as `migrate` makes it, reads the batches its original reads."""

from __future__ import annotations

import glob
import json
import os
from pathlib import Path

from typer.testing import CliRunner

from verify.capture.listing_order import sorted_listings
from verify.cli import app

SCRIPT = Path(__file__).resolve().parent / "scripts" / "listed_files.py"
NAMES = list("kcxaqmzbte")


def test_every_way_to_list_a_folder_lists_it_sorted_and_is_restored_after(tmp_path):
    for name in NAMES:
        (tmp_path / name).write_text(name)
    counts: dict = {}
    with sorted_listings(counts):
        with os.scandir(tmp_path) as entries:
            scanned = [entry.name for entry in entries]
        listings = [os.listdir(tmp_path), scanned, [Path(path).name for path in glob.glob(str(tmp_path / "*"))],
                    [path.name for path in tmp_path.iterdir()], next(os.walk(tmp_path))[2]]
    assert all(listing == sorted(NAMES) for listing in listings), listings
    assert counts["listings_sorted"] >= len(listings)
    assert os.listdir.__module__ in ("posix", "nt") and os.scandir.__module__ in ("posix", "nt")


def test_a_file_another_run_is_saving_is_not_listed(tmp_path):
    (tmp_path / "a.pt").write_text("a")
    (tmp_path / ".a.pt.npu-port-4242.tmp").write_text("half of a")  # whole_saves.temporary_name of a run at once
    (tmp_path / ".hidden").write_text("the script's own")
    with sorted_listings({}):
        assert os.listdir(tmp_path) == [".hidden", "a.pt"] and list(os.walk(tmp_path))[0][2] == [".hidden", "a.pt"]


def test_a_port_that_sorts_its_files_reads_the_batches_of_an_original_that_lists_them_unsorted(tmp_path):
    port = tmp_path / "listed_files_npu.py"
    port.write_text(SCRIPT.read_text().replace("os.listdir(folder)", "sorted(os.listdir(folder))"))
    result = CliRunner().invoke(app, ["pair", str(SCRIPT), str(port), "-n", "4", "-q", "-o", str(tmp_path / "out"),
                                      "--", "--folder", str(tmp_path / "data")])
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert (result.exit_code, summary["verdict"]) == (0, "PASS"), summary["reason"]
    manifest = json.loads((tmp_path / "out" / "ref" / "manifest.json").read_text())
    assert manifest["extra"]["listings_sorted"] >= 1
