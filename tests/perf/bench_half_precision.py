"""What a port's half precision costs on the emulated devices, measured side by side in one run with whole
`verify run` commands (each a child process; CPU seconds of the children, one torch thread, so that a shared
machine's neighbours count less):

- the capture ratio: the original on EMULATED CUDA with verify's defaults (modelled numerics, stats capture) against
  the original on the CPU without capture (`--device cpu --dump off`); target 1.5x;
- the port (migrate's, with fp16 autocast) on the emulated NPU with the defaults against the original on the CPU
  without capture; target 1.5x;
- the port's modelled numerics against `--exact-emulation`; target within 10%.

Variants are alternated round by round and the medians compared.

    python tests/perf/bench_half_precision.py [--sample mnist_cnn] [--rounds 3]
    python tests/perf/bench_half_precision.py --original main.py --port main_npu.py --steps 4 -- --epochs 1 ...

The default is a bundled sample, ported here with migrate; --original/--port take a script and its port (run from
their folder, with the arguments after --), such as pytorch/examples' siamese network.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/samples_support.py
from samples_support import port  # noqa: E402
from migrate import Mode  # noqa: E402

SAMPLES = Path(__file__).resolve().parents[2] / "samples"
TARGET_CAPTURE, TARGET_PORT, TARGET_MODELLED = 1.5, 1.5, 1.10

# name: (which script, verify run's options)
VARIANTS = {
    "original, cpu, no capture": ("original", ["--device", "cpu", "--dump", "off"]),
    "original, emulated cuda, defaults": ("original", []),
    "port, emulated npu, defaults": ("port", []),
    "port, emulated npu, --exact-emulation": ("port", ["--exact-emulation"]),
}


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_run(script: Path, options: list[str], steps: int, args: list[str], out: Path) -> float:
    """CPU seconds of one `verify run` (its process and the training child)."""
    command = [sys.executable, "-m", "verify.cli", "run", str(script), "--steps", str(steps), "-q", "-o", str(out),
               *options, "--", *args]
    started = children_cpu_seconds()
    done = subprocess.run(command, cwd=script.parent, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    seconds = children_cpu_seconds() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return seconds


def sample_scripts(sample: str, folder: Path) -> tuple[dict[str, Path], int, list[str]]:
    config = tomllib.loads((SAMPLES / sample / "verify.toml").read_text())
    original, ported = folder / "train.py", folder / "train_npu.py"
    original.write_text((SAMPLES / sample / "train_gpu.py").read_text())
    ported.write_text(port(original.read_text(), Mode.TRANSFER))
    return {"original": original, "port": ported}, config["steps"], config["args"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sample", default="mnist_cnn", help="a bundled sample (samples/NAME), ported here")
    parser.add_argument("--original", type=Path, help="a script, instead of a sample")
    parser.add_argument("--port", type=Path, help="its port, beside it")
    parser.add_argument("--steps", type=int, help="steps per run (a sample's verify.toml by default)")
    parser.add_argument("--rounds", type=int, default=3, help="alternated runs per variant")
    parser.add_argument("args", nargs="*", help="the script's arguments (after --)")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        if options.original:
            scripts, steps, args = {"original": options.original.resolve(), "port": options.port.resolve()}, 0, []
        else:
            scripts, steps, args = sample_scripts(options.sample, Path(folder))
        steps, args = options.steps or steps, options.args or args
        seconds: dict[str, list[float]] = {name: [] for name in VARIANTS}
        for round_number in range(options.rounds):
            for number, (name, (script, flags)) in enumerate(VARIANTS.items()):
                out = Path(folder) / f"round{round_number}-variant{number}"
                seconds[name].append(timed_run(scripts[script], flags, steps, args, out))
            print(f"round {round_number + 1}: " + ", ".join(f"{name} {values[-1]:.1f} s"
                                                           for name, values in seconds.items()), flush=True)
    median = {name: statistics.median(values) for name, values in seconds.items()}
    plain = median["original, cpu, no capture"]
    print(f"{scripts['port'].name} vs {scripts['original'].name}, {steps} steps, CPU seconds of whole runs, "
          f"medians of {options.rounds} alternated rounds")
    for name, value in median.items():
        print(f"  {name:40s} {value:7.2f} s  {value / plain:5.2f}x the original on the cpu")
    capture = median["original, emulated cuda, defaults"] / plain
    ported = median["port, emulated npu, defaults"] / plain
    modelled = median["port, emulated npu, defaults"] / median["port, emulated npu, --exact-emulation"]
    print(f"capture ratio (original, defaults / plain)       {capture:5.2f}x  (target <= {TARGET_CAPTURE}x)")
    print(f"fp16 port on the emulated npu / original on cpu  {ported:5.2f}x  (target <= {TARGET_PORT}x)")
    print(f"modelled numerics / --exact-emulation            {modelled:5.2f}x  (target <= {TARGET_MODELLED}x)")


if __name__ == "__main__":
    main()
