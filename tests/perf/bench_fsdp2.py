"""Cost of verifying an FSDP2 training on 2 ranks (issue 55), measured in one run and printed as ratios:
- the pair (`verify ORIGINAL PORT --nproc-per-node 2`: the port, then the reference and its calibration run at once)
  against its slowest side alone (`verify run PORT --nproc-per-node 2`);
- the capture's peak memory (the largest rank's resident set under `verify run`, statistics of every op, sharded
  records combined across the mesh) against the plain run's (the same port under torchrun on the emulated NPU, no
  verify).
The model is an MLP of `--layers` Linear(`--width`, `--width`) layers, each and the whole fully_shard-ed, trained with
Adam, each rank reading the same batches. Whole processes (the launcher, torch's import in every rank), the medians of
`--rounds`, as the machine is shared.

    python tests/perf/bench_fsdp2.py [--steps 4] [--layers 8] [--width 1024] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from verify.devices import DEVICE_COUNT_VAR, emulation_env

ORIGINAL = '''
import os, sys
import torch
from torch.distributed.fsdp import fully_shard

LAYERS, WIDTH, STEPS = (int(value) for value in sys.argv[1:4])


def main():
    device = torch.device(torch.accelerator.current_accelerator().type, int(os.environ["LOCAL_RANK"]))
    torch.accelerator.set_device_index(device.index)
    torch.distributed.init_process_group(backend=torch.distributed.get_default_backend_for_device(device),
                                         device_id=device)
    torch.manual_seed(0)
    layers = [module for _ in range(LAYERS) for module in (torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU())]
    model = torch.nn.Sequential(*layers).to(device)
    for layer in model[::2]:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    for step in range(STEPS):
        batch = torch.randn(16, WIDTH, generator=torch.Generator().manual_seed(step)).to(device)
        loss = model(batch).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
'''
NPU_IMPORTS = "import torch_npu\nfrom torch_npu.contrib import transfer_to_npu\n"
PORT = ORIGINAL.replace("import torch\n", f"import torch\n{NPU_IMPORTS}", 1)
# Runs a command and prints its wall seconds and the largest peak resident set of the processes it started (every
# descendant the command waited for: torchrun's ranks)
MEASURED = textwrap.dedent("""
    import json, resource, subprocess, sys, time
    started = time.perf_counter()
    done = subprocess.run(sys.argv[1:], capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode not in (0, 1):
        sys.exit(done.stdout[-2000:] + done.stderr[-3000:])
    print(json.dumps({"wall": wall, "rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
                      "code": done.returncode}))
""")


def measured(command: list[str], env: dict[str, str], cwd: Path) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", MEASURED, *command], capture_output=True, text=True, env=env,
                          cwd=cwd, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout)


def one_round(folder: Path, options: argparse.Namespace) -> dict[str, dict[str, float]]:
    # the script trains 2 steps more than verify records, so that it stops verify's steps, not by itself
    sizes = [str(options.layers), str(options.width), str(options.steps + 2)]
    ranks = ["--nproc-per-node", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    verify = [sys.executable, "-m", "verify"]
    plain_env = {**env, **emulation_env("cpu"), DEVICE_COUNT_VAR: "2"}
    results = {
        "plain": measured([sys.executable, "-m", "torch.distributed.run", *ranks, "--standalone", "port_npu.py",
                           *sizes[:2], str(options.steps)], plain_env, folder),
        "side": measured([*verify, "run", "port_npu.py", *ranks, "--steps", str(options.steps), "-q",
                          "-o", str(folder / "side"), "--", *sizes], env, folder),
        "pair": measured([*verify, "original.py", "port_npu.py", *ranks, "--steps", str(options.steps), "-q",
                          "-o", str(folder / "pair"), "--", *sizes], env, folder),
    }
    if results["pair"]["code"] != 0:
        raise SystemExit(f"the faithful pair did not pass: {(folder / 'pair' / 'summary.json').read_text()[:2000]}")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=2)
    options = parser.parse_args()
    rounds = []
    for number in range(options.rounds):
        with tempfile.TemporaryDirectory() as name:
            folder = Path(name)
            (folder / "original.py").write_text(ORIGINAL)
            (folder / "port_npu.py").write_text(PORT)
            rounds.append(one_round(folder, options))
        print(f"round {number + 1}: " + ", ".join(f"{what} {result['wall']:.1f} s, {result['rss_mib']:.0f} MiB"
                                                  for what, result in rounds[-1].items()), flush=True)
    median = {what: {key: statistics.median(result[what][key] for result in rounds) for key in ("wall", "rss_mib")}
              for what in rounds[0]}
    parameters = options.layers * (options.width + 1) * options.width
    print(f"FSDP2 on 2 ranks, {parameters / 1e6:.1f}M parameters, {options.steps} steps, {os.cpu_count()} cores, "
          f"medians of {options.rounds}:")
    print(f"  the pair {median['pair']['wall']:.1f} s against its slowest side alone {median['side']['wall']:.1f} s: "
          f"{median['pair']['wall'] / median['side']['wall']:.2f}x")
    print(f"  peak memory of a rank: under the capture {median['side']['rss_mib']:.0f} MiB against the plain run's "
          f"{median['plain']['rss_mib']:.0f} MiB: {median['side']['rss_mib'] / median['plain']['rss_mib']:.2f}x")


if __name__ == "__main__":
    main()
