"""The device table (verify/devices/__init__.py DEVICE_TABLE) is the one place a device is described: every name has
a row, every row's set-up function exists, an emulation is never titled as the real device, and no module outside
verify/devices spells a device's name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from verify import devices
from verify.devices import DEVICE_TABLE, Device, EmulateOn
from verify.devices import setup as device_setup

VERIFY = Path(devices.__file__).resolve().parents[1]


def test_every_device_has_its_row():
    assert list(DEVICE_TABLE) == [device.value for device in Device]
    assert all(row.device.value == name for name, row in DEVICE_TABLE.items())


@pytest.mark.parametrize("row", DEVICE_TABLE.values(), ids=DEVICE_TABLE)
def test_every_row_names_a_set_up_function_of_devices_setup(row):
    assert callable(getattr(device_setup, row.set_up, None)), f"verify/devices/setup.py has no {row.set_up}()"


@pytest.mark.parametrize("row", DEVICE_TABLE.values(), ids=DEVICE_TABLE)
@pytest.mark.parametrize("on", ["", *(target.value for target in EmulateOn)])
def test_an_emulation_is_titled_emulated_and_a_real_device_never(row, on):
    named = devices.title(row.device.value, devices.emulated_on(row.device.value, on or EmulateOn.CPU.value))
    assert ("EMULATED" in named) == row.emulated


@pytest.mark.parametrize("row", [row for row in DEVICE_TABLE.values() if row.emulated], ids=lambda row: row.device)
def test_an_emulation_stands_for_a_real_device_and_reads_its_precision_switches(row):
    real = DEVICE_TABLE[row.family.value]
    assert not real.emulated and real.family == real.device
    assert row.reduced_fp32 == real.reduced_fp32
    assert row.autocast_device_type == real.autocast_device_type


def _spelled_devices(path: Path) -> list[str]:
    """Where `path` names a device other than `auto` (the CLI's default): an `emulated-*` literal or `Device.X`."""
    emulated_names = {row.device.value for row in DEVICE_TABLE.values() if row.emulated}
    spelled = []
    for node in ast.walk(ast.parse(path.read_text())):
        literal = isinstance(node, ast.Constant) and node.value in emulated_names
        member = isinstance(node, ast.Attribute) and _name(node.value) == "Device" and node.attr != Device.AUTO.name
        if literal or member:
            spelled.append(f"{path.relative_to(VERIFY.parent)}:{node.lineno}")
    return spelled


def _name(node: ast.expr) -> str:
    """`Device` for both `Device` and `devices.Device`."""
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def test_no_module_outside_the_devices_package_spells_a_device():
    outside = [path for path in VERIFY.rglob("*.py") if VERIFY / "devices" not in path.parents]
    assert [place for path in outside for place in _spelled_devices(path)] == []


@pytest.mark.parametrize(("reference", "port", "calibration"), [
    ("cuda", "emulated-npu", "emulated-cuda"),  # a GPU reference: its stand-in on the CPU, where the port computes
    ("auto", "emulated-npu", "emulated-cuda"),
    ("cpu", "emulated-npu", "cpu"),
    ("emulated-cuda", "emulated-npu", "emulated-cuda"),
    ("cuda", "npu", "cuda"),  # a real NPU: the reference's own device
])
def test_a_calibration_computes_where_the_port_does(reference, port, calibration):
    assert devices.reference_on_the_ports_hardware(reference, port, EmulateOn.CPU.value) == calibration
