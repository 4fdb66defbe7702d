"""How much `migrate` costs over a bare libcst round trip, and how a folder scales with --jobs.

    .venv/bin/python tests/perf/bench_migrate.py [--script FILE ...] [--lines 5000] [--files 200] [--repeat 5]

--script adds real training scripts (pytorch/examples, nanoGPT, ...) to the per-file table; the largest sample is
always in it. The whole-process table runs them concatenated into one file (the samples, without --script).

Prints tables of times and of ratios measured in the same run, so a loaded machine slows both sides alike. Targets
(design README, Performance; issues 11 and 23): all rules on a real script cost at most 3x `parse_module` + `.code`
of that file; a whole `migrate` process on the concatenated scripts at most 2x a whole process that parses and prints
them with libcst; `migrate --version` starts in at most 0.3 s; a folder is faster with --jobs 2 than with --jobs 1.
The "pieces" table puts the engine's replacements for libcst's walk and QualifiedNameProvider beside the originals, on
the same generated file.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider, QualifiedNameProvider

from migrate.engine import migrate_source
from migrate.files import plan, run_jobs
from rules import all_rules
from rules import Settings, TRIVIA, Walk
from rules.framework.names import QualifiedNames
from rules.framework.positions import Positions

ROOT = Path(__file__).resolve().parents[2]
TARGET_RATIO = 3.0
TARGET_PROCESS_RATIO = 2.0
TARGET_START_S = 0.3
BARE_PROCESS = (
    "import libcst, sys; sys.stdout.write(libcst.parse_module(open(sys.argv[1], encoding='utf-8').read()).code)"
)

HEADER = '''"""A generated, realistic GPU training script (benchmark input)."""
import argparse
import gc
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.cuda.amp import GradScaler, autocast
from torch.nn.parallel import DistributedDataParallel as DDP
'''

BLOCK = '''

class Block{i}(nn.Module):
    """Residual block number {i}."""

    def __init__(self, channels: int = 64, dropout: float = 0.1):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, kernel_size=3, padding=1)  # same size
        self.norm = nn.BatchNorm2d(channels)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        y = F.relu(self.norm(self.conv(x)))
        return x + self.drop(y)


def train_epoch_{i}(model, loader, optimizer, scaler, device="cuda", log_every=10):
    model.train()
    total = 0.0
    for step, (images, labels) in enumerate(loader):
        images, labels = images.cuda(non_blocking=True), labels.to(device)
        optimizer.zero_grad(set_to_none=True)
        with autocast():
            loss = F.cross_entropy(model(images), labels)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        total += loss.item()
        if step % log_every == 0 and dist.get_rank() == 0:
            print(f"step {{step}}: loss {{loss.item():.4f}}, {{torch.cuda.memory_allocated() / 2**20:.1f}} MiB")
    torch.cuda.synchronize()
    return total / max(1, len(loader))
'''

FOOTER = '''

def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.backends.cudnn.benchmark = True
    model = DDP(Block0().cuda(), device_ids=[torch.cuda.current_device()])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = GradScaler()
    for epoch in range(args.epochs):
        train_epoch_0(model, [], optimizer, scaler)


if __name__ == "__main__":
    main()
'''


def realistic_script(lines: int) -> str:
    """A training script of about `lines` lines: blocks of model code and training loops full of cuda calls."""
    parts, count, index = [HEADER], HEADER.count("\n"), 0
    while count < lines:
        block = BLOCK.format(i=index)
        parts.append(block)
        count += block.count("\n")
        index += 1
    return "".join(parts) + FOOTER


def best_of(repeat: int, work: Callable[[], object]) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return min(times)


def round_trip(source: str) -> str:
    return cst.parse_module(source).code


def alternating(rounds: int, *works: Callable[[], object]) -> list[float]:
    """The least CPU time of each of `works` over `rounds` rounds that run them in turn: on a shared machine, the
    other processes' load and its drift over the run reach both sides alike, and CPU time leaves out the waits."""
    return least_of_rounds(rounds, *(lambda work=work: _cpu_seconds(work) for work in works))


def least_of_rounds(rounds: int, *measurements: Callable[[], float]) -> list[float]:
    """The least of the seconds each of `measurements` gives over `rounds` rounds that run them in turn."""
    times: list[list[float]] = [[] for _ in measurements]
    for _ in range(rounds):
        for measure, spent in zip(measurements, times):
            gc.collect()  # each side starts with no garbage of the other's to collect
            spent.append(measure())
    return [min(spent) for spent in times]


def _cpu_seconds(work: Callable[[], object]) -> float:
    start = time.process_time()
    work()
    return time.process_time() - start


def per_file(sources: dict[str, str], repeat: int) -> None:
    """Ratios of migrate with every rule to a bare round trip of the same file."""
    rules = all_rules()
    print(f"\nAll {len(rules)} rules vs a bare parse + codegen (target <= {TARGET_RATIO}x), CPU seconds, least of"
          f" {repeat} alternating rounds")  # fmt: skip
    print(f"{'file':42} {'lines':>6} {'bare s':>8} {'migrate s':>10} {'ratio':>6}")
    for name, source in sources.items():
        bare, ported = alternating(
            repeat, lambda: round_trip(source), lambda: migrate_source(source, name, Settings(), rules)
        )
        verdict = "ok" if ported / bare <= TARGET_RATIO else "OVER"
        print(f"{name:42} {source.count(chr(10)):6d} {bare:8.3f} {ported:10.3f} {ported / bare:6.2f}x {verdict}")


def pieces(source: str, repeat: int) -> None:
    """The engine's parts beside the libcst parts they replace, as ratios to a bare parse + codegen."""
    module = cst.parse_module(source)
    bare = best_of(repeat, lambda: round_trip(source))
    nothing = Walk(lambda node: True, lambda original, updated: updated, wants=lambda kind: True, skip=TRIVIA)
    rows = {
        "parse_module": lambda: cst.parse_module(source),
        "Module.code": lambda: module.code,
        "libcst no-op CSTTransformer walk (before)": lambda: module.visit(cst.CSTTransformer()),
        "rules.walk no-op walk (after)": lambda: nothing.run(module),
        "QualifiedNameProvider, all nodes (before)": lambda: _all_qualified_names(module, libcst=True),
        "rules.names, all nodes (after)": lambda: _all_qualified_names(module, libcst=False),
        "PositionProvider, all nodes (before)": lambda: MetadataWrapper(module, unsafe_skip_copy=True).resolve(
            PositionProvider
        ),
        "rules.positions, all nodes (after)": lambda: len(Positions(module)),
    }
    print(f"\nPieces on the generated {source.count(chr(10))}-line script (ratio to bare parse + codegen)")
    for label, work in rows.items():
        seconds = best_of(repeat, work)
        print(f"{label:46} {seconds:8.3f} s {seconds / bare:6.2f}x")


def _all_qualified_names(module: cst.Module, libcst: bool) -> int:
    names = _Collect()
    module.visit(names)
    if libcst:
        provided = MetadataWrapper(module, unsafe_skip_copy=True).resolve(QualifiedNameProvider)
        return sum(len(value() if callable(value) else value) for value in map(provided.get, names.nodes) if value)
    ours = QualifiedNames(module)
    return sum(len(ours.get(node, ())) for node in names.nodes)


class _Collect(cst.CSTVisitor):
    def __init__(self) -> None:
        self.nodes: list[cst.CSTNode] = []

    def visit_Name(self, node: cst.Name) -> None:
        self.nodes.append(node)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self.nodes.append(node)

    def visit_Call(self, node: cst.Call) -> None:
        self.nodes.append(node)


def whole_processes(scripts: list[str], repeat: int) -> None:
    """Whole processes, side by side: migrate on the concatenated scripts against libcst parsing and printing them,
    and `migrate --version` against an interpreter that does nothing."""
    with tempfile.TemporaryDirectory() as temporary:
        script = Path(temporary) / "concatenated.py"
        script.write_text("\n".join(text if text.endswith("\n") else text + "\n" for text in scripts), encoding="utf-8")
        commands = {
            "bare: libcst parse + print": ["-c", BARE_PROCESS, str(script)],
            "migrate FILE (port + reports)": ["-m", "migrate", str(script), "-o", str(Path(temporary) / "out.py"), "-q"],
            "migrate FILE --check": ["-m", "migrate", str(script), "--check", "-q"],
            "python -c pass": ["-c", "pass"],
            "migrate --version": ["-m", "migrate", "--version"],
        }
        lines = script.read_text(encoding="utf-8").count("\n")
        runs = [lambda arguments=arguments: _run_python(arguments) for arguments in commands.values()]
        times = least_of_rounds(repeat, *runs)
        walls = least_of_rounds(repeat, lambda: _run_python(commands["migrate --version"], wall=True))
    print(f"\nWhole processes on {len(scripts)} scripts concatenated ({lines} lines), CPU seconds of the child, least of"
          f" {repeat} alternating rounds (target: migrate <= {TARGET_PROCESS_RATIO}x bare)")  # fmt: skip
    bare = times[0]
    for (label, _), seconds in zip(commands.items(), times):
        ratio = f"{seconds / bare:6.2f}x" if label.startswith(("bare", "migrate FILE")) else ""
        verdict = ("ok" if seconds / bare <= TARGET_PROCESS_RATIO else "OVER") if label.startswith("migrate FILE") else ""
        print(f"{label:32} {seconds:8.3f} s {ratio} {verdict}")
    verdict = "ok" if walls[0] <= TARGET_START_S else "OVER"
    print(f"migrate --version start-up, wall clock: {walls[0]:.3f} s (target <= {TARGET_START_S} s) {verdict}")


def _run_python(arguments: list[str], wall: bool = False) -> float:
    """Run `python ARGUMENTS` from the repository (its own code, not an installed copy); returns the CPU seconds the
    process spent (its wall-clock seconds with `wall`)."""
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    done = subprocess.run([sys.executable, *arguments], cwd=ROOT, env=environment, stdout=subprocess.DEVNULL)
    if done.returncode > 1:  # 1 is --check's "a port is needed"
        raise RuntimeError(f"{arguments} exited {done.returncode}")
    after, elapsed = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter() - start
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return elapsed if wall else cpu


def folder(files: int, lines: int) -> None:
    rules = all_rules()
    with tempfile.TemporaryDirectory() as temporary:
        root = Path(temporary) / "project"
        root.mkdir()
        for index in range(files):
            (root / f"module_{index:03d}.py").write_text(realistic_script(lines))
        jobs = plan([root], Settings(), write=False)
        timings = {}
        for workers in (1, 2):
            start = time.perf_counter()
            results = run_jobs(jobs, rules, workers)
            timings[workers] = time.perf_counter() - start
            timings[f"diffs{workers}"] = [result.diff for result in results]
        same = timings["diffs1"] == timings["diffs2"]
        print(f"\nFolder of {files} files x {lines} lines (--check)")
        print(f"--jobs 1 {timings[1]:8.2f} s | --jobs 2 {timings[2]:8.2f} s | speed-up {timings[1] / timings[2]:.2f}x"
              f" | identical results: {same}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=5000, help="size of the generated script")
    parser.add_argument("--files", type=int, default=200, help="files in the folder benchmark")
    parser.add_argument("--file-lines", type=int, default=100, help="lines of each file in the folder benchmark")
    parser.add_argument("--repeat", type=int, default=5, help="rounds (best of N) per measurement")
    parser.add_argument("--script", type=Path, action="append", default=[], help="a real script to measure too")
    args = parser.parse_args()
    migrate_source("import torch\n")  # imports and per-type caches, outside every measurement
    generated = realistic_script(args.lines)
    samples = {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in sorted(ROOT.glob("samples/*/train_gpu.py"))}
    scripts = {str(path): path.read_text(encoding="utf-8") for path in args.script}
    per_file({**samples, **scripts, f"generated ({args.lines} lines)": generated}, args.repeat)
    whole_processes(list(scripts.values()) or list(samples.values()), args.repeat)
    pieces(generated, args.repeat)
    folder(args.files, args.file_lines)


if __name__ == "__main__":
    main()
