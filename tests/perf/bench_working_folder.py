"""What a run's own working folder costs (verify/launch/working_folder.py, issue 43): the view of a script's folder
that holds a large data folder, made before the run and settled after it, against the `verify run` of a tiny
training in that folder (its wall time, view included). Measured in one run, medians of --rounds, printed as
seconds, microseconds an entry and ratios.

    python tests/perf/bench_working_folder.py [--files 20000 100000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from typer.testing import CliRunner

from verify.cli import app
from verify.launch import working_folder

TRAIN = """import torch
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(100):
    optimizer.zero_grad()
    model(torch.randn(4, 8)).pow(2).mean().backward()
    optimizer.step()
"""


def _project(folder: Path, files: int) -> Path:
    """A script beside a data folder of `files` small files, 1,000 a folder (an image dataset's layout)."""
    project = folder / f"project-{files}"
    project.mkdir()
    for number in range(files):
        shard = project / "data" / f"class{number // 1000:04d}"
        if number % 1000 == 0:
            shard.mkdir(parents=True)
        (shard / f"{number}.jpg").write_bytes(b"x" * 64)
    (project / "train.py").write_text(TRAIN)
    return project


def _view_seconds(project: Path, folder: Path) -> tuple[float, float]:
    target = folder / "view"
    started = time.perf_counter()
    made = working_folder.make([project], target)
    made_s = time.perf_counter() - started
    started = time.perf_counter()
    working_folder.settle(made)
    settled_s = time.perf_counter() - started
    shutil.rmtree(target)
    return made_s, settled_s


def _run_seconds(project: Path, folder: Path, number: int) -> float:
    started = time.perf_counter()
    result = CliRunner().invoke(app, ["run", str(project / "train.py"), "-n", "5", "-o", str(folder / f"run-{number}")])
    if result.exit_code != 0:
        sys.exit(f"verify run failed: {result.output}")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, nargs="+", default=[20_000, 100_000])
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        small = _project(folder, 0)
        run_s = statistics.median(_run_seconds(small, folder, number) for number in range(options.rounds))
        print(f"verify run of a 5-step training, its folder holding only the script: {run_s:.2f} s")
        for files in options.files:
            project = _project(folder, files)
            made, settled = zip(*(_view_seconds(project, folder) for _ in range(options.rounds)))
            total = statistics.median(made) + statistics.median(settled)
            entries = files + files // 1000 + 2
            print(f"{files:>7} data files ({entries} entries): view made in {statistics.median(made):.2f} s, settled "
                  f"in {statistics.median(settled):.2f} s, {1e6 * total / entries:.1f} us an entry; "
                  f"{total / run_s:.2f}x the run above, per run of a pair's three")
            shutil.rmtree(project)


if __name__ == "__main__":
    main()
