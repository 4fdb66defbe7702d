"""A full disk is verify's limit, not the script's crash (issue 43, item 7): one line, exit 2, within seconds, every
manifest closed and no lock left. Before, a thread's traceback, then a hang until the timeout (458 s) with manifests
left `running`.

The disk is filled for real without filling the machine: `verify` runs under RLIMIT_FSIZE (inherited by its child),
so that each write past the limit fails with EFBIG, as a write to a full disk fails with ENOSPC, through the same
calls (Python ignores SIGXFSZ). A small tmpfs or loop device needs mount rights that a test cannot count on.
"""

from __future__ import annotations

import re
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from verify.record.run_folders import WRITER_LOCK
from verify.record.store import read_manifest

SCRIPTS = Path(__file__).resolve().parent / "scripts"
LIMIT_BYTES = 100 * 1024
# verify ends about 2 s after the disk filled on an idle machine; the hang this replaces lasted until the timeout
WITHIN_S = 60


def verify_on_a_full_disk(tmp_path: Path, *args: str) -> tuple[int, str, float]:
    """`verify ARGS` with the disk full past LIMIT_BYTES a file: its exit code, its stderr, and the seconds it went on
    after the disk filled, from the last write into the file its error names (how long torch took to start, on a
    busy machine, is no part of it)."""
    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT_BYTES, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    verify = subprocess.run([sys.executable, "-m", "verify", *args], cwd=tmp_path, capture_output=True, text=True,
                            preexec_fn=limited, timeout=600)
    ended = time.time()
    full = re.search(r"no space left to write (\S+)", " ".join(verify.stderr.split()))
    assert full, verify.stderr
    return verify.returncode, verify.stderr, ended - (tmp_path / full.group(1)).stat().st_mtime


def training(tmp_path: Path, name: str, output_per_step: int = 0) -> Path:
    script = tmp_path / name
    text = (SCRIPTS / "long_train.py").read_text()
    # a printing script keeps a short pause a step: verify stops it within its poll (0.5 s) of output.log filling,
    # long before its own records could fill the limit too (unpaused, it ran 107 steps meanwhile and its gradient
    # stream was named instead)
    pause = "    time.sleep(0.02)\n" if output_per_step else ""
    script.write_text(text.replace("    time.sleep(0.2)\n", f"    print('x' * {output_per_step}, flush=True)\n{pause}"))
    return script


def assert_closed(folder: Path) -> None:
    manifests = list(folder.rglob("manifest.json"))
    assert manifests and all(read_manifest(path.parent).status != "running" for path in manifests)
    assert not list(folder.rglob(WRITER_LOCK))


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


@pytest.mark.slow
@pytest.mark.parametrize("output_per_step, full, dump", [(0, "ops/steps.arrows", "stats"), (60000, "output.log", "off")])
def test_a_run_on_a_full_disk_is_one_line_and_exit_2_within_seconds(tmp_path, output_per_step, full, dump):
    """The child's records (the op stream) or the parent's copy of the script's output (output.log) fill it; the
    latter without an op stream (--dump off), which would otherwise fill it as fast."""
    out = tmp_path / "run"
    script = training(tmp_path, "train.py", output_per_step)
    code, err, after_full_s = verify_on_a_full_disk(tmp_path, "run", str(script), "--steps", "500", "--dump", dump,
                                                    "-q", "-o", str(out), "--", "500")
    assert code == 2, err
    assert after_full_s < WITHIN_S and "Traceback" not in err
    assert len(error_lines(err)) == 1
    assert f"no space left to write {out / full}" in " ".join(err.split())
    assert_closed(out)
    assert read_manifest(out).verify_error


@pytest.mark.slow
def test_a_pair_on_a_full_disk_is_one_line_and_exit_2_with_every_manifest_closed(tmp_path):
    out = tmp_path / "pair"
    original = training(tmp_path, "train.py")
    port = training(tmp_path, "train_npu.py")
    code, err, after_full_s = verify_on_a_full_disk(tmp_path, str(original), str(port), "--steps", "500", "-q",
                                                    "-o", str(out), "--", "500")
    assert code == 2, err
    assert after_full_s < WITHIN_S and "Traceback" not in err
    assert len(error_lines(err)) == 1 and "no space left to write" in err
    assert_closed(out)
