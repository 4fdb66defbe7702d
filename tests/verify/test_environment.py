"""The environment each run records and the differences a comparison lists (verify/record/environment.py): the pure diff
on hand-made manifests, and a real pair whose port switches HF32 on, which the emulated NPU computes."""

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from verify.cli import app
from verify.compare.findings import Finding, FindingCode, explaining, how_to_equal
from verify.record.environment import Difference, differences
from verify.capture.environment_record import recorded_variables
from verify.cli.pair import route
from verify.record.schema import RunManifest
from verify.report.advice import advise

SCRIPTS = Path(__file__).resolve().parent / "scripts"


def manifest(**groups) -> RunManifest:
    record = {"versions": {"torch": "2.13.0"}, "precision": {"fp32_matmul": "fp32", "fp32_conv": "fp32"},
              "environment": {}, "data_loaders": [{"shuffle": False, "num_workers": 0}]}
    for group, values in groups.items():
        record[group] = values
    return RunManifest(extra={"environment": record})


def test_differences_lists_each_differing_setting_numerics_first():
    ref = manifest(versions={"torch": "2.13.0+cu130"}, environment={"HCCL_DETERMINISTIC": "true"})
    actual = manifest(precision={"fp32_matmul": "hf32", "fp32_conv": "fp32"},
                      data_loaders=[{"shuffle": True, "num_workers": 0}])
    assert differences(ref, actual) == [
        Difference("precision.fp32_matmul", "fp32", "hf32"),
        Difference("data_loaders.0.shuffle", False, True),
        Difference("environment.HCCL_DETERMINISTIC", "true", None),
        Difference("versions.torch", "2.13.0+cu130", "2.13.0"),
    ]
    assert differences(ref, ref) == []
    assert differences(ref, RunManifest()) == []  # a run without a record (older verify, msprobe dump)


def test_tf32_on_a_gpu_and_hf32_on_an_npu_are_one_setting():
    """Both round fp32 matmul and convolution inputs to a 10-bit mantissa: a GPU reference's default TF32
    convolutions against the NPU's default HF32 ones is no difference (it was advice item 1 on the mnist sample)."""
    ref = manifest(precision={"fp32_matmul": "fp32", "fp32_conv": "tf32"})
    assert differences(ref, manifest(precision={"fp32_matmul": "fp32", "fp32_conv": "hf32"})) == []
    assert differences(ref, manifest(precision={"fp32_matmul": "fp32", "fp32_conv": "fp32"})) == [
        Difference("precision.fp32_conv", "tf32", "fp32")]


def test_the_autocast_verify_imposed_on_a_reference_is_no_environment_difference():
    """nanoGPT's faithful port listed "amp.imposed_autocast: ref bf16, actual off": verify's own autocast on the
    reference, which the comparison's policy and notes describe, read as a setting for the user to mend."""
    imposed, own = manifest(amp={"imposed_autocast": "bf16"}), manifest(amp={"imposed_autocast": "off"})
    assert differences(imposed, own) == []
    fp16 = manifest(amp={"imposed_autocast": "bf16", "acl_precision_mode": "allow_fp32_to_fp16"})
    assert differences(imposed, fp16) == [Difference("amp.acl_precision_mode", None, "allow_fp32_to_fp16")]


def test_torch_matmul_precision_is_not_compared_between_devices_with_switches_of_their_own(tmp_path):
    """nanoGPT's allow_tf32 = True reads "high" in torch.get_float32_matmul_precision() on the GPU; its port's
    allow_hf32 = True leaves it "highest" on the NPU. fp32_matmul (tf32, hf32: one setting) says what both compute
    in, and the pair lists no difference (it did, on the H200 fixture nanogpt-ok); between CPUs, which have no such
    switch, the setting is compared."""
    import shutil

    from verify.record.store import read_manifest

    fixture = Path(__file__).resolve().parent / "fixtures" / "gpu-runs-h200" / "nanogpt-ok"
    ref, actual = (read_manifest(fixture / side) for side in ("ref", "actual"))
    assert (ref.device, actual.device) == ("cuda", "emulated-npu")
    assert [d.setting for d in differences(ref, actual) if d.setting.startswith("precision.")] == []
    high, highest = (manifest(precision={"fp32_matmul": "fp32", "fp32_conv": "fp32",
                                         "float32_matmul_precision": value}) for value in ("high", "highest"))
    high.device = highest.device = "cpu"
    assert differences(high, highest) == [Difference("precision.float32_matmul_precision", "high", "highest")]


@pytest.mark.parametrize(("op", "step", "explained"), [
    ("aten.addmm", 2, ["precision.fp32_matmul"]),
    ("aten.convolution", 2, []),
    ("aten.relu", 0, ["data_loaders.0.shuffle"]),
])
def test_explaining_keys_a_difference_to_the_ops_it_changes(op, step, explained):
    found = [Difference("precision.fp32_matmul", "fp32", "hf32"), Difference("data_loaders.0.shuffle", False, True),
             Difference("versions.torch", "a", "b")]
    first = {"op": op, "actual_op": op, "step": step}
    assert [d.setting for d in explaining(found, first)] == explained
    assert explaining(found, None) == []


@pytest.mark.parametrize(("explained", "says", "never"), [
    ([Difference("data_loaders.0.shuffle", True, False)], "DataLoader arguments (shuffle=", "allow_tf32"),
    ([Difference("precision.fp32_matmul", "fp32", "hf32")], "torch.npu.matmul.allow_hf32", "DataLoader"),
])
def test_the_environment_advice_says_where_the_explaining_setting_is_set(explained, says, never):
    """A port whose DataLoader no longer shuffles (accelerate's gradient_accumulation.py with shuffle=False) is told
    to pass the DataLoader's arguments as the original does, not to set TF32 and HF32; a matmul precision switch
    still is."""
    finding = Finding(FindingCode.ENVIRONMENT_DIFFERS, "environments differ", {
        "explains": "; ".join(d.text for d in explained), "how": how_to_equal(explained), "op": "aten.embedding",
        "step": 0})
    text = advise([finding])[0].message
    assert says in text and never not in text, text


def test_recorded_variables_are_allow_listed_and_never_secrets():
    environ = {"HCCL_DETERMINISTIC": "true", "CLOSE_MATMUL_K_SHIFT": "1", "HOME": "/root", "AWS_SECRET_KEY": "x",
               "HCCL_AUTH_TOKEN": "x", "NCCL_DEBUG": "INFO", "PYTHONHASHSEED": "0"}
    assert recorded_variables(environ) == {"CLOSE_MATMUL_K_SHIFT": "1", "HCCL_DETERMINISTIC": "true",
                                           "NCCL_DEBUG": "INFO", "PYTHONHASHSEED": "0"}


@pytest.mark.slow
def test_a_pair_differing_in_hf32_lists_it_and_the_advice_names_it(tmp_path):
    """The port is the original on the (emulated) NPU with HF32 matmuls: its linear layer loses the small difference
    of two inputs near 1.0. The environment diff says so, and the advice names it before any operator advice."""
    original = SCRIPTS / "cancelling_linear.py"
    port = tmp_path / "cancelling_linear_npu.py"
    port.write_text(original.read_text().replace(
        "import torch\n", "import torch\nimport torch_npu\n", 1).replace(
        'device = "cuda" if torch.cuda.is_available() else "cpu"',
        'device = "npu"\ntorch.npu.matmul.allow_hf32 = True'))
    out = tmp_path / "out"
    argv = [str(original), str(port), "-n", "3", "-q", "-o", str(out)]
    result = CliRunner().invoke(app, route(argv, typer.main.get_command(app)))
    assert result.exit_code == 1, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert {"setting": "precision.fp32_matmul", "ref": "fp32", "actual": "hf32"} in summary["environment_differences"]
    environment = next(f for f in summary["findings"] if f["code"] == "environment_differs")
    assert "precision.fp32_matmul: ref fp32, actual hf32" in environment["detail"]["explains"]
    assert "precision.fp32_matmul" in summary["advice"][0]
    assert "Environment differences" in (out / "report.html").read_text()
