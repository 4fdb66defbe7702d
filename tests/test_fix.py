"""`migrate PORT --fix-from PAIR` (issue 47) on real pairs: scripts that overflow in fp16, or whose port seeds or
orders its data otherwise, are ported by migrate, verified by the verify CLI, and fixed; a port broken by a changed lr
or batch size is left failing with its cause named."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

_SCRIPT = '''import torch
from torch import nn


def main():
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = nn.Linear(8, 8).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(6):
        x = {scale} * torch.randn(16, 8, device=device)
        optimizer.zero_grad()
        h = model(x)
{lines}
        loss.backward()
        optimizer.step()
        print(f"step {{step}} loss {{loss.item():.4g}}")


if __name__ == "__main__":
    main()
'''
# h * 4000 overflows fp16 (65504) where |h| > 16.4; in fp32 it is exact. The loss is small: its gradients fit the
# GradScaler's first scale, so the overflow in the forward pass is the one cause.
OVERFLOWING_OP = "        z = h * 4000\n        loss = (z / 4000).mean() * 1e-3"
# A sum times 1000: under a scale of 2**16 and its halvings, every fp16 gradient overflows and each step is skipped.
OVERFLOWING_SCALE = "        loss = h.mean() * 1000"
PLAIN = "        loss = h.pow(2).mean()"


def _run(*args: object, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=900)


def _port_and_pair(tmp_path: Path, lines: str, scale: int = 1, edit=lambda text: text,
                   script: str = _SCRIPT) -> tuple[Path, Path]:
    original = tmp_path / "train.py"
    original.write_text(script.format(scale=scale, lines=lines))
    assert _run("-m", "migrate", "-q", original.name, cwd=tmp_path).returncode == 0
    port = tmp_path / "train_npu.py"
    port.write_text(edit(port.read_text()))
    _run("-m", "verify", original.name, port.name, "--steps", "3", "--amp-effect", "-q", "-o", "pair", cwd=tmp_path)
    return port, tmp_path / "pair"


def _fix(port: Path, pair: Path) -> tuple[subprocess.CompletedProcess, dict, str]:
    before = port.read_bytes()
    done = _run("-m", "migrate", port.name, "--fix-from", pair.name, cwd=port.parent)
    assert port.read_bytes() == before  # never over the user's file
    folder = pair.with_name("pair_fix")
    return done, json.loads((folder / "fix.json").read_text()), (folder / "fix.md").read_text()


def test_an_op_that_overflows_in_fp16_is_kept_in_fp32_and_the_port_passes(tmp_path):
    port, pair = _port_and_pair(tmp_path, OVERFLOWING_OP, scale=20)
    summary = json.loads((pair / "summary.json").read_text())
    # both sides overflow under the port's autocast, and the loss with it: the port's half precision, named
    assert summary["reason"].startswith("FAIL: aten.mul (top level, train_npu.py:")
    assert "overflows in float16 under the port's autocast" in summary["reason"]
    assert summary["pair"]["amp_effect"]["passed"] is False  # fp32 does not
    done, record, report = _fix(port, pair)
    assert done.returncode == 0, done.stderr
    fixed = (tmp_path / "train_npu_fixed.py").read_text()
    assert 'with torch.autocast(device_type="npu", enabled=False):\n                z = h.float() * 4000' in fixed
    first = record["rounds"][0]
    line = fixed.splitlines().index("            with torch.autocast(device_type=\"npu\", enabled=False):") + 1
    assert first["causes"][0]["code"] == "overflow" and "aten.mul" in first["causes"][0]["message"]
    assert [(r["code"], r["at"]) for r in first["rewrites"]] == [("AMP201", f"train_npu_fixed.py:{line}")]
    assert first["verdict"] == "PASS" and first["wall_s"] > 0
    assert record["rounds"][-1]["verdict"] == "PASS" and record["passed"]
    assert "`AMP201`" in report and "verdict after: **PASS**" in report
    assert "+                z = h.float() * 4000" in (pair.with_name("pair_fix") / "diff.patch").read_text()
    # once more without verifying: the same fix, into a new fix folder; the fixed port is a fix's own, so replaced
    again = _run("-m", "migrate", port.name, "--fix-from", pair.name, "--fix-rounds", "0", cwd=tmp_path)
    assert again.returncode == 0 and "written, not verified" in again.stderr
    assert (tmp_path / "train_npu_fixed.py").read_text() == fixed
    assert json.loads((tmp_path / "pair_fix.1" / "fix.json").read_text())["rounds"][0]["verdict"] == "not verified"
    # a fix from a new pair (verify run again) replaces the earlier fix's file, which the port's report folder records
    _run("-m", "verify", "train.py", port.name, "--steps", "3", "-q", "-o", "pair2", cwd=tmp_path)
    again = _run("-m", "migrate", port.name, "--fix-from", "pair2", "--fix-rounds", "0", cwd=tmp_path)
    assert again.returncode == 0 and "was not written by a fix" not in again.stderr, again.stderr
    assert (tmp_path / "train_npu_fixed.py").read_text() == fixed
    # a fixed port edited since is the user's: kept as .bak, and the fix written again
    (tmp_path / "train_npu_fixed.py").write_text(fixed + "# mine\n")
    kept = _run("-m", "migrate", port.name, "--fix-from", pair.name, "--fix-rounds", "0", cwd=tmp_path)
    assert kept.returncode == 0 and "train_npu_fixed.py was not written by a fix as it is now" in kept.stderr
    assert (tmp_path / "train_npu_fixed.py.bak").read_text() == fixed + "# mine\n"
    assert (tmp_path / "train_npu_fixed.py").read_text() == fixed


_MODULE_OVERFLOWS = '''import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.big = nn.Linear(8, 64)
        self.norm = nn.LayerNorm(64)
        self.head = nn.Linear(64, 1)
        with torch.no_grad():
            self.big.weight.mul_(5000)  # its outputs pass fp16's 65504; the layer norm brings them back

    def forward(self, x):
        return self.head(torch.relu(self.norm(self.big(x))))


def main():
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = Net().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(6):
        x = 20 * torch.randn(16, 8, device=device)
        optimizer.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
'''


def test_an_op_that_overflows_in_a_module_is_kept_in_fp32_alone_the_rest_of_its_line_in_half_precision(tmp_path):
    """Issue 56: AMP201 kept the whole line in fp32 (four ops, where self.big's one overflowed): the call of the
    module verify named is computed first, in fp32, and the rest of the line stays under the port's autocast."""
    port, pair = _port_and_pair(tmp_path, "", script=_MODULE_OVERFLOWS.replace("{", "{{").replace("}", "}}"))
    summary = json.loads((pair / "summary.json").read_text())
    assert summary["overflow"]["actual_first"]["module"].endswith("big"), summary["overflow"]
    done, record, _ = _fix(port, pair)
    assert done.returncode == 0, done.stderr
    fixed = (tmp_path / "train_npu_fixed.py").read_text()
    assert ('        with torch.autocast(device_type="npu", enabled=False):\n'
            '            big_fp32 = self.big(x.float())\n'
            '        return self.head(torch.relu(self.norm(big_fp32)))\n') in fixed, fixed
    assert record["rounds"][0]["causes"][0]["callee"] == "big" and record["passed"]


_HELPERS = "import torch\n\n\ndef amplified(h):\n    return h * 4000  # past fp16's 65504 where |h| > 16.4\n"


def test_an_op_that_overflows_in_a_function_of_another_file_is_kept_in_fp32_where_the_port_calls_it(tmp_path):
    """The op is in helpers.py, which the fix does not write: the port's call of helpers.amplified under autocast is
    kept in fp32 instead, its argument cast."""
    (tmp_path / "helpers.py").write_text(_HELPERS)
    script = _SCRIPT.replace("from torch import nn\n", "from torch import nn\n\nimport helpers\n")
    port, pair = _port_and_pair(tmp_path, "        z = helpers.amplified(h)\n        loss = (z / 4000).mean() * 1e-3",
                                scale=20, script=script)
    summary = json.loads((pair / "summary.json").read_text())
    assert summary["reason"].startswith("FAIL: aten.mul (top level, helpers.py:5, step 0) overflows in float16")
    done, record, report = _fix(port, pair)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "helpers.py").read_text() == _HELPERS
    fixed = (tmp_path / "train_npu_fixed.py").read_text()
    assert ('with torch.autocast(device_type="npu", enabled=False):\n                z = helpers.amplified(h.float())'
            in fixed)
    first = record["rounds"][0]
    assert first["causes"][0]["function"] == "helpers.amplified" and "helpers.py:5" in first["causes"][0]["message"]
    assert [r["code"] for r in first["rewrites"]] == ["AMP201"] and record["passed"]


def test_a_loss_scale_that_overflows_at_every_step_starts_lower(tmp_path):
    port, pair = _port_and_pair(tmp_path, OVERFLOWING_SCALE)
    summary = json.loads((pair / "summary.json").read_text())
    trace = summary["overflow"]["actual_scale"]
    # 3 steps asked for, and the pair went on while the scale fell, until the script's 6 steps ended
    assert trace["skipped"] == list(range(6)) and trace["scales"] == [2.0 ** (16 - k) for k in range(6)]
    # the reference followed the port's scaler and skipped alike, but the original has none: the port never trained
    assert summary["verdict"] == "FAIL" and "updates_skipped" in [finding["code"] for finding in summary["findings"]]
    assert ("skipped the update of each of its 6 steps (loss scale 65536 down to 2048; the script ended while it "
            "still fell)") in summary["reason"]
    assert any("init_scale=2.0**k) with 2**k below 2048" in advice for advice in summary["advice"])
    assert summary["pair"]["amp_effect"]["passed"] is False  # the fp32 reference updates where the port skips
    done, record, report = _fix(port, pair)
    assert done.returncode == 0, done.stderr
    first = record["rounds"][0]
    assert first["causes"][0]["code"] == "updates_skipped" and first["causes"][0]["init_scale"] == 32.0
    assert [r["code"] for r in first["rewrites"]] == ["AMP202"]
    assert "init_scale=2.0**" in (tmp_path / "train_npu_fixed.py").read_text()
    assert record["passed"] and record["rounds"][-1]["verdict"] == "PASS"
    assert "`AMP202`" in report


# Style-transfer-shaped: a Gram matrix of the features under autocast, its squared error weighted as
# fast_neural_style weights its style loss (1e10 there, 1e7 here); its fp16 gradients overflow at every loss scale of
# 1 and above.
_STYLE = '''import torch
from torch import nn


def main():
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 8)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(8):
        x = torch.randn(16, 8, device=device)
        optimizer.zero_grad()
        features = model(x)
        gram = features.t() @ features / features.shape[0]
        loss = (gram.float() - torch.eye(8, device=device)).pow(2).sum() * 1e7
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
'''


def test_gradients_that_overflow_at_every_loss_scale_of_1_and_above_get_a_scale_below_1(tmp_path):
    """Issue 56's third rung: the loss-scale search goes below 1, round after round, until the updates fit."""
    port, pair = _port_and_pair(tmp_path, "", script=_STYLE.replace("{", "{{").replace("}", "}}"))
    summary = json.loads((pair / "summary.json").read_text())
    assert "updates_skipped" in {f["code"] for f in summary["findings"]}
    # where the scaled gradients first overflow: the backward of the loss's cast to fp32, at the port's loss line
    first = summary["overflow"]["actual_first_skipped"]
    line = next(n for n, text in enumerate(port.read_text().splitlines(), 1) if "loss = (gram.float()" in text)
    assert (first["phase"], first["source"]) == ("backward", f"train_npu.py:{line}"), first
    assert f"overflowed at every scale (first in {first['op']} of the backward pass of train_npu.py:{line}, step 0)" \
        in summary["reason"]
    done, record, report = _fix(port, pair)
    assert done.returncode == 0, done.stderr
    scales = [cause["init_scale"] for r in record["rounds"] for cause in r["causes"]]
    assert scales[-1] < 1 and {r["rung"] for r in record["rounds"]} == {3}, record["rounds"]
    assert "init_scale=2.0**-" in (tmp_path / "train_npu_fixed.py").read_text()
    assert record["passed"] and "rung 3 of 5" in report and "a loss-scale search that may go below 1" in report
    assert "% of the forward and backward records computed in half precision; step time " in report


_AMPLIFIER = ("from torch import nn\n\n\nclass Amplified(nn.Module):\n    def forward(self, h):\n"
              "        return h * 4000\n")


def test_an_overflow_in_a_module_of_another_file_climbs_to_bf16_or_on_a_chip_without_it_to_fp32(tmp_path):
    """Issue 56's last rungs: the op overflows in a method of helpers.py, which the fix does not write, so the call,
    forward and loss-scale rungs have nothing to rewrite: the autocast computes in bf16, the port saying on which
    chips; with --no-bf16 (the 910A) the step computes in fp32. Each PASSes, and fix.md names the rungs."""
    (tmp_path / "helpers.py").write_text(_AMPLIFIER)
    script = _SCRIPT.replace("from torch import nn\n", "from torch import nn\n\nimport helpers\n")
    port, pair = _port_and_pair(tmp_path, "        z = helpers.Amplified()(h)\n        loss = (z / 4000).mean() * 1e-3",
                                scale=20, script=script)
    assert json.loads((pair / "summary.json").read_text())["overflow"]["actual_first"]["source"] == "helpers.py:6"
    done, record, report = _fix(port, pair)
    assert done.returncode == 0, done.stderr
    fixed = (tmp_path / "train_npu_fixed.py").read_text()
    assert ("        # bf16: Ascend 910B (Atlas A2/A3) and later; the 910A has no bf16\n"
            '        with torch.autocast(device_type="npu", dtype=torch.bfloat16):') in fixed, fixed
    assert [r["rung"] for r in record["rounds"]] == [4] and record["passed"]
    assert ("climbed past rung 1 (nothing more to rewrite), 2 (nothing more to rewrite), 3 (nothing more to "
            "rewrite)") in report and "rung 4 of 5" in report
    assert (tmp_path / "helpers.py").read_text() == _AMPLIFIER
    done = _run("-m", "migrate", port.name, "--fix-from", pair.name, "--no-bf16", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    fixed = (tmp_path / "train_npu_fixed.py").read_text()
    assert 'dtype=torch.float16, enabled=False):' in fixed and 'GradScaler("npu", enabled=False)' in fixed, fixed
    report = (tmp_path / "pair_fix.1" / "fix.md").read_text()
    assert "4 (the target NPU computes no bf16)" in report and "rung 5 of 5" in report and "(PASS)" in report


def test_a_changed_lr_is_named_and_left_failing(tmp_path):
    port, pair = _port_and_pair(tmp_path, PLAIN, edit=lambda text: text.replace("lr=0.01", "lr=0.1"))
    assert json.loads((pair / "summary.json").read_text())["verdict"] == "FAIL"
    done, record, report = _fix(port, pair)
    assert done.returncode == 1
    assert not (tmp_path / "train_npu_fixed.py").exists()
    assert record["rounds"] == [] and not record["passed"]
    assert [cause["code"] for cause in record["left"]] == ["hparam_mismatch"]
    assert "hparam\\_mismatch" in report or "hparam_mismatch" in report


def test_gradients_never_reset_are_named_and_left_not_given_a_lower_loss_scale(tmp_path):
    """pytorch/examples' tensor-parallel toy never calls zero_grad; an fp16 port's GradScaler skips every step, as
    the inf of the first overflow stays in the gradients. The fix lowered init_scale to 2**-3, which put the first inf
    off past the 3 steps verified (a PASS), while verify's advice said no scale helps: it now names the gradients
    never reset and writes nothing."""
    scripts = Path(__file__).parent / "verify" / "scripts"
    original, port, pair = tmp_path / "train.py", tmp_path / "train_npu.py", tmp_path / "pair"
    original.write_text((scripts / "never_zeroed_sum_loss.py").read_text())
    port.write_text((scripts / "never_zeroed_sum_loss_npu.py").read_text())  # by hand: migrate leaves it in float32
    _run("-m", "verify", original.name, port.name, "--steps", "3", "-q", "-o", pair.name, cwd=tmp_path)
    assert json.loads((pair / "summary.json").read_text())["verdict"] == "FAIL"
    done, record, report = _fix(port, pair)
    assert done.returncode == 1
    assert not (tmp_path / "train_npu_fixed.py").exists()
    assert record["rounds"] == [] and [cause["code"] for cause in record["left"]] == ["grads_carried"]
    assert "reset them once per optimizer step" in report


def test_a_changed_activation_is_named_and_left_failing(tmp_path):
    port, pair = _port_and_pair(tmp_path, "        loss = torch.relu(h).pow(2).mean()",
                                edit=lambda text: text.replace("torch.relu(h)", "torch.sigmoid(h)"))
    summary = json.loads((pair / "summary.json").read_text())
    assert summary["verdict"] == "FAIL" and "op_changed" in {f["code"] for f in summary["findings"]}
    done, record, _ = _fix(port, pair)
    assert done.returncode == 1 and not (tmp_path / "train_npu_fixed.py").exists()
    assert record["rounds"] == [] and "op_changed" in [cause["code"] for cause in record["left"]]
    assert "call the original's" in done.stderr


_LOADER = ("    loader = DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=8, shuffle=True, "
           "generator=torch.Generator().manual_seed(7))\n")
# The original shuffles with a generator of its own: its first batch and initial weights follow from seeds 0 and 7.
_ORDERED = _SCRIPT.replace("import torch\n", "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n") \
    .replace("    optimizer = ", _LOADER + "    optimizer = ").replace(
    "    for step in range(6):\n        x = {scale} * torch.randn(16, 8, device=device)\n",
    "    for step, (x,) in enumerate(loader):\n        x = x.to(device)\n")


def _ordered_pair(tmp_path: Path, edit, script: str = _ORDERED) -> tuple[Path, Path]:
    original = tmp_path / "train.py"
    original.write_text(script.format(lines=PLAIN))
    assert _run("-m", "migrate", "-q", original.name, cwd=tmp_path).returncode == 0
    port = tmp_path / "train_npu.py"
    port.write_text(edit(port.read_text()))
    _run("-m", "verify", original.name, port.name, "--steps", "3", "-q", "-o", "pair", cwd=tmp_path)
    return port, tmp_path / "pair"


def _another_order(text: str) -> str:
    """The port seeds with 1 where the original seeds with 0, and its DataLoader shuffles from the global generator."""
    changed = text.replace("torch.manual_seed(0)", "torch.manual_seed(1)").replace(
        ", generator=torch.Generator().manual_seed(7)", "")
    assert changed.count("DataLoader(") == 1 and "manual_seed(1)" in changed and "generator=" not in changed
    return changed


def test_a_port_seeded_and_shuffled_otherwise_gets_the_originals_seed_and_generator(tmp_path):
    port, pair = _ordered_pair(tmp_path, _another_order)
    summary = json.loads((pair / "summary.json").read_text())
    assert summary["verdict"] == "FAIL" and "data_order" in {f["code"] for f in summary["findings"]}
    done, record, report = _fix(port, pair)
    assert done.returncode == 0, done.stderr
    fixed = (tmp_path / "train_npu_fixed.py").read_text()
    assert "torch.manual_seed(0)" in fixed and "generator=torch.Generator().manual_seed(7))" in fixed
    first = record["rounds"][0]
    assert first["causes"][0]["code"] == "data_order"
    assert sorted(r["code"] for r in first["rewrites"]) == ["DATA201", "DET201"]
    assert first["verdict"] == "PASS" and record["passed"]
    assert "`DET201`" in report and "`DATA201`" in report and "verdict after: **PASS**" in report


# pytorch/examples mnist's way: the order arguments in a dict the loader takes as **kwargs, updated from another.
_KWARGS = _ORDERED.replace(_LOADER, "    kwargs = {{'batch_size': 8}}\n    accel = {{'shuffle': True}}\n"
                           "    kwargs.update(accel)\n    loader = DataLoader(TensorDataset(torch.randn(64, 8)), **kwargs)\n")


def test_a_port_unshuffled_in_its_loaders_kwargs_dict_gets_the_originals_shuffle_there(tmp_path):
    port, pair = _ordered_pair(tmp_path, lambda text: text.replace("'shuffle': True", "'shuffle': False"), _KWARGS)
    summary = json.loads((pair / "summary.json").read_text())
    assert summary["verdict"] == "FAIL" and "data_order" in {f["code"] for f in summary["findings"]}
    done, record, _ = _fix(port, pair)
    assert done.returncode == 0, done.stderr
    assert "accel = {'shuffle': True}" in (tmp_path / "train_npu_fixed.py").read_text()
    assert [r["code"] for r in record["rounds"][0]["rewrites"]] == ["DATA201"] and record["passed"]


def test_a_changed_batch_size_is_named_and_left_failing(tmp_path):
    port, pair = _ordered_pair(tmp_path, lambda text: text.replace("batch_size=8", "batch_size=16"))
    assert json.loads((pair / "summary.json").read_text())["verdict"] == "FAIL"
    done, record, report = _fix(port, pair)
    assert done.returncode == 1 and not (tmp_path / "train_npu_fixed.py").exists()
    assert [(c["code"], c["message"]) for c in record["left"]] == [
        ("data_hparam", "data_loaders.0.batch_size differs: ref 8, port 16")]
    assert "batch\\_size" in report or "batch_size" in report
