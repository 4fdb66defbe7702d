"""Benchmark: `verify compare` on a pair of run directories at scale, its reports against the comparison itself.

    python tests/perf/bench_compare.py [--records 60000] [--steps 10]

Writes a pair of run directories (verify/record/schema.py's record columns, through store.RunWriter) shaped like a short
GPT training: `--steps` steps of `--records / --steps` op records a side, spread over modules and ops. The port's
statistics carry device noise, 1% of its ops are renamed to a related NPU kernel, 0.1% are missing and 0.1% extra
(so every alignment pass does work), and from the middle step on, the last two thirds of each step drift by 5%
(thousands of rows past tolerance, a first divergent operator, a FAIL). Then measures, side by side in this one run:
the comparison alone (reading both run directories and compare_runs, in this process), each report writer on its
result, and whole `verify compare` processes without and with `-o` (interpreter start and imports included).
Target (issue 25): the whole `verify compare -o` process within 2x the comparison alone as a process (`verify
compare` without reports: the same start and imports); every report within the comparison's time in this process.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from verify.compare.runs import ComparisonResult, compare_runs  # noqa: E402
from verify.record.evidence import read_side  # noqa: E402
from verify.report.writers import report_writers  # noqa: E402
from verify.report.xlsx import op_sheets  # noqa: E402
from verify.record.schema import OP_COLUMNS, RunManifest  # noqa: E402
from verify.record.store import RunWriter, write_manifest  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
OPS = ["aten.addmm", "aten.native_layer_norm", "aten.gelu", "aten.mm", "aten.add", "aten.mul", "aten._softmax",
       "aten.view", "aten.bmm", "aten.native_dropout"]
OPS_PER_MODULE_CALL = 50
DRIFT = 1.05


def synthetic_trace(records: int, steps: int, seed: int) -> pd.DataFrame:
    """Every column of schema.OP_COLUMNS; each op reads the previous one's output (a sequential data flow)."""
    rng = np.random.default_rng(seed)
    per_step = records // steps
    seq = np.tile(np.arange(per_step), steps)
    module_index = seq // OPS_PER_MODULE_CALL
    frame = pd.DataFrame({
        "step": np.repeat(np.arange(steps), per_step), "seq": seq,
        "phase": np.where(seq < per_step // 2, "forward", "backward"),
        "module": np.char.add("GPT.transformer.h.", (module_index % 40).astype(str)),
        "op": np.array(OPS)[seq % len(OPS)], "io": "out0"})
    frame["call_index"] = frame.groupby(["step", "phase", "module", "op"]).cumcount()
    frame["key"] = (frame["step"].astype(str) + "/" + frame["phase"] + "/" + frame["module"] + "/" + frame["op"]
                    + "#" + frame["call_index"].astype(str))
    scale = rng.uniform(0.5, 2.0, len(frame))
    frame = frame.assign(dtype="float32", shape="64x128", numel=8192, min=-3 * scale, max=3 * scale,
                         mean=rng.normal(0, 0.1, len(frame)), l2_norm=64 * scale, nan_count=0, inf_count=0, md5="",
                         tensor_file="", inputs=np.where(seq > 0, (seq - 1).astype(str), ""), source="", attrs="")
    return frame[list(OP_COLUMNS)].astype(OP_COLUMNS)


def ported(ref: pd.DataFrame, steps: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    actual = ref.copy()
    for stat in ("min", "max", "mean", "l2_norm"):
        actual[stat] = actual[stat] * (1 + rng.normal(0, 1e-7, len(actual)))
    drifting = (actual["step"] >= steps // 2) & (actual["seq"] >= actual["seq"].max() // 3)
    actual.loc[drifting, "l2_norm"] *= DRIFT
    gelu = actual["op"] == "aten.gelu"
    renamed = gelu & (rng.random(len(actual)) < 0.1)  # ~1% of all records: the NPU's fast GELU
    actual.loc[renamed, "op"] = "npu.npu_fast_gelu"
    actual.loc[renamed, "key"] = actual.loc[renamed, "key"].str.replace("aten.gelu", "npu.npu_fast_gelu")
    # Missing calls are drawn from other ops than GELU: a missing call next to a renamed one is ambiguous by signature
    # (either ref call could be the renamed one), which would make this benchmark report a divergence it planted.
    dropped = (rng.random(len(actual)) < 0.001) & ~gelu
    extra = actual.loc[rng.random(len(actual)) < 0.001].assign(op="aten._to_copy", key=lambda f: f["key"] + "c")
    return pd.concat([actual.loc[~dropped], extra], ignore_index=True).sort_values(["step", "seq"], kind="stable")


def write_run_directory(root: Path, ops: pd.DataFrame, steps: int, device: str, drift: float) -> Path:
    """A finished run directory as `verify run` leaves it: manifest, losses.csv, hparams.csv, ops/steps.arrows."""
    root.mkdir(parents=True)
    write_manifest(root, RunManifest(script=str(root / "chargpt.py"), device=device, seed=1234, status="ok",
                                     steps_requested=steps, steps_completed=steps))
    writer = RunWriter(root)
    loss = 4.2 * np.exp(-0.05 * np.arange(steps)) * (1 + drift * np.arange(steps))
    writer.append_losses([step, 0, loss[step], None, 100.0] for step in range(steps))
    writer.append_hparams((step, 0, name, value, 0) for step in range(steps)
                          for name, value in (("lr", 5e-4), ("betas", [0.9, 0.95]), ("weight_decay", 0.1)))
    for step, part in ops.groupby("step"):
        writer.write_step_table("ops", int(step), part.to_dict("list"))
    writer.close()
    return root


def best_of(repeats: int, action: Callable[[], Any]) -> tuple[float, Any]:
    """The fastest of `repeats` wall times of `action` (the machine is shared: the fastest is the least disturbed),
    and what it returned."""
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        value = action()
        seconds.append(time.perf_counter() - start)
    return min(seconds), value


def xlsx_cells(result: ComparisonResult) -> int:
    """The cells of ops.xlsx's operator sheets (the summary sheet's few dozen aside)."""
    return sum(sheet.shown.size + len(sheet.shown.columns) for sheet in op_sheets(result))


def verify_process(code: str, *args: str, cwd: Path) -> None:
    """A Python process running `code` with this checkout's verify (started outside the checkout); exit 0 or 1 (a
    verdict) only."""
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=cwd,
                          env=os.environ | {"PYTHONPATH": str(ROOT)})
    if done.returncode not in (0, 1):
        sys.exit(f"{code} {' '.join(args)} failed:\n{done.stderr[-2000:]}")


def verify_compare(ref: Path, actual: Path, *options: str) -> None:
    verify_process("from verify.cli import main; main()", "compare", str(ref), str(actual), *options, cwd=ref.parent)


def time_comparison(ref_dir: Path, actual_dir: Path, repeats: int) -> tuple[float, ComparisonResult]:
    reading, runs = best_of(repeats, lambda: (read_side(ref_dir), read_side(actual_dir)))
    comparing, result = best_of(repeats, lambda: compare_runs(*runs))
    print(f"{'comparison alone':>30}: {reading + comparing:6.2f} s (reading {reading:.2f}, compare_runs "
          f"{comparing:.2f}): {result.verdict.reason[:60]}...")
    return reading + comparing, result


def time_reports(result: ComparisonResult, out: Path, repeats: int) -> float:
    """Each report writer on its own, and what they share; their sum."""
    preparing, writers = best_of(repeats, lambda: report_writers(result))
    print(f"{'shared by the writers':>30}: {preparing:6.2f} s (advice, summary, the full table for pyarrow)")
    out.mkdir()
    total = preparing
    for name, write in writers.items():
        seconds, _ = best_of(repeats, lambda: write(out / name))
        total += seconds
        rate = f", {xlsx_cells(result) / seconds:,.0f} cells/s" if name == "ops.xlsx" else ""
        print(f"{name:>30}: {seconds:6.2f} s, {(out / name).stat().st_size / 1e6:5.1f} MB{rate}")
    return total


def time_processes(ref_dir: Path, actual_dir: Path, comparison: float, repeats: int) -> None:
    start, _ = best_of(repeats, lambda: verify_process("import verify.cli", cwd=ref_dir.parent))
    bare, _ = best_of(repeats, lambda: verify_compare(ref_dir, actual_dir))
    whole, _ = best_of(repeats, lambda: verify_compare(ref_dir, actual_dir, "-o", str(ref_dir.parent / "out")))
    print(f"{'a process importing verify':>30}: {start:6.2f} s (what every verify command pays first)")
    print(f"{'verify compare, no reports':>30}: {bare:6.2f} s (the comparison alone, as a process)")
    print(f"{'verify compare -o':>30}: {whole:6.2f} s: {whole / bare:.2f}x the comparison alone as a process "
          f"(target: 2x); {whole / comparison:.2f}x it in this process, where nothing starts or imports")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=60_000)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3, help="each figure is the fastest of this many")
    args = parser.parse_args()
    ref_ops = synthetic_trace(args.records, args.steps, seed=0)
    actual_ops = ported(ref_ops, args.steps, seed=1)
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        ref_dir = write_run_directory(work / "ref", ref_ops, args.steps, "emulated-cuda", 0.0)
        actual_dir = write_run_directory(work / "actual", actual_ops, args.steps, "emulated-npu", 0.002)
        print(f"op records: ref {len(ref_ops):,}, actual {len(actual_ops):,}; wall seconds, each the fastest of "
              f"{args.repeats}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        comparison, result = time_comparison(ref_dir, actual_dir, args.repeats)
        reports = time_reports(result, work / "reports", args.repeats)
        print(f"{'every report':>30}: {reports:6.2f} s: {reports / comparison:.2f}x the comparison alone")
        time_processes(ref_dir, actual_dir, comparison, args.repeats)


if __name__ == "__main__":
    main()
