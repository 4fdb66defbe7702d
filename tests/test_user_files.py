"""Every user file arrives (issue 22): a folder's port keeps every file, a port never replaces a file of the user's
(it refuses before writing anything), names that are not UTF-8 are ported and reported with escapes, and the
reports' modes follow the umask. Each case on real files."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from migrate.cli import app

IMP001 = ("--select", "IMP001")  # the one rule that always acts on `import torch`: fast and predictable
TORCH = b"import torch\n"


def migrate(*args: object):
    return CliRunner().invoke(app, [str(arg) for arg in args])


def write(path: Path, data: bytes = TORCH) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_a_folder_port_keeps_the_users_own_name_npu_file(tmp_path):
    write(tmp_path / "src" / "layers.py")
    user = write(tmp_path / "src" / "layers_npu.py", b"import torch\nfrom layers import *\n")
    write(tmp_path / "src" / "model.py", b"import torch\nimport layers_npu\n")
    result = migrate(tmp_path / "src", *IMP001)
    assert result.exit_code == 0, result.stderr
    assert sorted(path.name for path in (tmp_path / "src_npu").iterdir()) == ["layers.py", "layers_npu.py", "model.py"]
    assert (tmp_path / "src_npu" / "layers_npu.py").read_bytes().endswith(b"from layers import *\n")
    assert user.read_bytes() == b"import torch\nfrom layers import *\n"  # the original untouched


def test_a_folder_port_leaves_out_an_earlier_runs_port_and_its_report(tmp_path):
    write(tmp_path / "src" / "train.py")
    assert migrate(tmp_path / "src" / "train.py", *IMP001).exit_code == 0  # train_npu.py, train_npu_report/
    result = migrate(tmp_path / "src", *IMP001)
    assert result.exit_code == 0, result.stderr
    assert sorted(path.name for path in (tmp_path / "src_npu").iterdir()) == ["train.py"]


def test_a_port_never_replaces_a_users_file_and_says_how_to_name_it_otherwise(tmp_path):
    write(tmp_path / "train.py")
    user = write(tmp_path / "train_npu.py", b"# mine\n")
    result = migrate(tmp_path / "train.py", *IMP001)
    assert result.exit_code == 2
    assert result.stderr.replace("\n", "") == (
        f"error: {user} already exists and is not an earlier port of {tmp_path / 'train.py'} (no train_npu_report/ "
        "beside it): nothing was written; name the port otherwise with --suffix or -o")
    assert user.read_bytes() == b"# mine\n" and sorted(p.name for p in tmp_path.iterdir()) == ["train.py",
                                                                                                "train_npu.py"]
    assert migrate(tmp_path / "train.py", "--suffix", "_ascend", *IMP001).exit_code == 0
    assert (tmp_path / "train_ascend.py").exists() and (tmp_path / "train_ascend_report" / "report.md").exists()
    assert migrate(tmp_path / "train.py", "-o", tmp_path / "elsewhere.py", *IMP001).exit_code == 0
    assert user.read_bytes() == b"# mine\n"


def test_a_folder_port_refuses_a_users_folder_of_its_name_before_writing(tmp_path):
    write(tmp_path / "src" / "a.py")
    user = write(tmp_path / "src_npu" / "notes.txt", b"mine")
    result = migrate(tmp_path / "src", *IMP001)
    assert result.exit_code == 2 and "src_npu already exists and is not an earlier port" in result.stderr
    assert [path.name for path in user.parent.iterdir()] == ["notes.txt"]
    assert not (tmp_path / "src_npu_report").exists()


@pytest.mark.parametrize("report_dir", [False, True])
def test_an_earlier_port_is_ported_over_again(tmp_path, report_dir):
    write(tmp_path / "train.py")
    options = ("--report-dir", tmp_path / "reports") if report_dir else ()
    assert migrate(tmp_path / "train.py", *IMP001, *options).exit_code == 0
    second = migrate(tmp_path / "train.py", *IMP001, *options)
    assert second.exit_code == 0, second.stderr


@pytest.mark.parametrize("suffix", ["", "a/b", "."])
def test_a_suffix_that_names_no_file_is_refused(tmp_path, suffix):
    write(tmp_path / "train.py")
    result = migrate(tmp_path / "train.py", "--suffix", suffix)
    assert result.exit_code == 2 and "--suffix" in result.stderr


def test_a_name_that_is_not_utf8_is_ported_and_reported_with_escapes(tmp_path):
    source = tmp_path / os.fsdecode(b"src")
    write(source / os.fsdecode(b"y\xff.py"), b"import torch\n\nif __name__ == '__main__':\n    pass\n")  # an entry
    done = subprocess.run([sys.executable, "-m", "migrate", "src", *IMP001], cwd=tmp_path, capture_output=True,
                          env=os.environ | {"PYTHONPATH": str(Path(__file__).parents[1])})
    assert done.returncode == 0, done.stderr
    assert os.listdir(os.fsencode(tmp_path / "src_npu")) == [b"y\xff.py"]
    report = (tmp_path / "src_npu_report" / "report.md").read_text(encoding="utf-8")
    assert "| `src/y\\xff.py` | changed |" in report
    assert b'--- "a/src/y\\377.py"\n' in (tmp_path / "src_npu_report" / "diff.patch").read_bytes()  # as git quotes it
    diff = subprocess.run([sys.executable, "-m", "migrate", "src", "--diff", *IMP001], cwd=tmp_path,
                          capture_output=True, env=os.environ | {"PYTHONPATH": str(Path(__file__).parents[1])})
    assert diff.returncode == 1 and b'--- "a/src/y\\377.py"\n' in diff.stdout, diff.stderr


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_reports_have_the_mode_the_umask_gives_new_files(tmp_path, umask):
    write(tmp_path / "train.py")
    previous = os.umask(umask)
    try:
        assert migrate(tmp_path / "train.py", *IMP001).exit_code == 0
    finally:
        os.umask(previous)
    modes = {stat.S_IMODE(path.stat().st_mode) for path in (tmp_path / "train_npu_report").iterdir()}
    assert modes == {0o666 & ~umask}


# ----- a port the user edited is theirs (issue 36) ---------------------------------------------------------------

SCRIPT = b"import torch\n\n\ndef main():\n    x = torch.zeros(3).cuda()\n    print(x)\n"


def edited(port: Path, old: bytes = b"print(x)", new: bytes = b"print(x + 1)  # mine") -> bytes:
    port.write_bytes(port.read_bytes().replace(old, new))
    return port.read_bytes()


def test_porting_again_over_an_unedited_port_changes_nothing(tmp_path):
    original = write(tmp_path / "again.py", SCRIPT)
    assert migrate(original).exit_code == 0
    port = tmp_path / "again_npu.py"
    ported, inode = port.read_bytes(), port.stat().st_ino
    os.utime(port, ns=(0, 10**18))  # a rewrite would show in the time stamp, a replacement in the inode
    second = migrate(original)
    assert second.exit_code == 0, second.stderr
    assert (port.read_bytes(), port.stat().st_ino, port.stat().st_mtime_ns) == (ported, inode, 10**18)


def test_a_port_edited_by_hand_is_not_replaced_and_the_refusal_names_the_file_and_line(tmp_path):
    original = write(tmp_path / "again.py", SCRIPT)
    assert migrate(original).exit_code == 0
    port = tmp_path / "again_npu.py"
    mine = edited(port)
    line = mine.splitlines().index(b"    print(x + 1)  # mine") + 1
    result = migrate(original)
    assert result.exit_code == 2
    assert result.stderr.replace("\n", "") == (
        f"error: {port} was changed since migrate wrote it: it differs from the new port at line {line}; nothing was "
        "written. Keep your changes (move them into the original, or name the new port with -o or --suffix), or pass "
        "--force to port again, your file kept as again_npu.py.bak first")
    assert port.read_bytes() == mine and not (tmp_path / "again_npu.py.bak").exists()


def test_an_edit_is_refused_even_when_the_original_changed_too(tmp_path):
    original = write(tmp_path / "again.py", SCRIPT)
    assert migrate(original).exit_code == 0
    mine = edited(tmp_path / "again_npu.py")
    original.write_bytes(SCRIPT + b"main()\n")
    result = migrate(original)
    assert result.exit_code == 2 and "was changed since migrate wrote it" in result.stderr
    assert (tmp_path / "again_npu.py").read_bytes() == mine


def test_force_keeps_the_edited_port_as_a_backup_and_never_replaces_a_backup(tmp_path):
    original = write(tmp_path / "again.py", SCRIPT)
    assert migrate(original).exit_code == 0
    port = tmp_path / "again_npu.py"
    fresh = port.read_bytes()
    first_edit = edited(port)
    forced = migrate(original, "--force")
    assert forced.exit_code == 0, forced.stderr
    assert f"kept as {tmp_path / 'again_npu.py.bak'}" in forced.stderr.replace("\n", "")
    assert port.read_bytes() == fresh and (tmp_path / "again_npu.py.bak").read_bytes() == first_edit
    assert migrate(original).exit_code == 0  # the forced port is migrate's own again
    second_edit = edited(port, new=b"print(x * 2)")
    assert migrate(original, "--force").exit_code == 0
    assert (tmp_path / "again_npu.py.bak").read_bytes() == first_edit
    assert (tmp_path / "again_npu.py.bak.1").read_bytes() == second_edit


def test_an_edit_that_matches_the_new_port_loses_nothing_and_is_ported_over(tmp_path):
    original = write(tmp_path / "again.py", SCRIPT)
    assert migrate(original).exit_code == 0
    original.write_bytes(SCRIPT.replace(b"print(x)", b"print(x + 1)"))
    edited(tmp_path / "again_npu.py", new=b"print(x + 1)")  # the user made the change in both
    result = migrate(original)
    assert result.exit_code == 0, result.stderr
    assert not (tmp_path / "again_npu.py.bak").exists()


def test_a_file_edited_in_a_folders_port_is_refused_before_anything_is_written(tmp_path):
    write(tmp_path / "src" / "model.py", SCRIPT)
    write(tmp_path / "src" / "train.py", SCRIPT)
    config = write(tmp_path / "src" / "config.yaml", b"lr: 0.1\n")
    assert migrate(tmp_path / "src").exit_code == 0
    copied = tmp_path / "src_npu" / "config.yaml"
    copied.write_bytes(b"lr: 0.2\n")  # a copied file is as much the user's once edited
    mine = edited(tmp_path / "src_npu" / "train.py")
    config.write_bytes(b"lr: 0.3\n")
    result = migrate(tmp_path / "src")
    assert result.exit_code == 2
    refused = [line for line in result.stderr.replace("\n ", " ").splitlines() if line.startswith("error:")]
    assert len(refused) == 2 and "config.yaml was changed" in refused[0] and "train.py was changed" in refused[1]
    assert copied.read_bytes() == b"lr: 0.2\n" and (tmp_path / "src_npu" / "train.py").read_bytes() == mine


def test_a_port_without_a_record_is_replaced_only_if_nothing_would_be_lost(tmp_path):
    """A port written before migrate kept its record (or whose report folder lost it): its bytes are compared with
    the new port's. (The report folder's own files are the user's once unrecorded: another report folder here.)"""
    original = write(tmp_path / "again.py", SCRIPT)
    assert migrate(original).exit_code == 0
    assert migrate(original, "--report-dir", tmp_path / "first").exit_code == 0  # no record: nothing to lose
    edited(tmp_path / "again_npu.py")
    result = migrate(original, "--report-dir", tmp_path / "second")
    assert result.exit_code == 2 and "migrate has no record of writing it" in result.stderr.replace("\n", "")


@pytest.mark.parametrize("where", ["--report-dir", "beside"])
def test_a_report_folder_file_migrate_did_not_write_is_refused_or_kept_under_force(tmp_path, where):
    """Issue 43: --report-dir DIR, or a report folder already there, lost the user's own report.md and findings.csv."""
    original = write(tmp_path / "train.py", SCRIPT)
    folder = tmp_path / ("notes" if where == "--report-dir" else "train_npu_report")
    mine = {"report.md": b"# my notes\n", "findings.csv": b"a,b\n1,2\n", "keep.txt": b"mine\n"}
    for name, data in mine.items():
        write(folder / name, data)
    options = ["--report-dir", folder] if where == "--report-dir" else []
    result = migrate(original, *options)
    assert result.exit_code == 2 and not (tmp_path / "train_npu.py").exists()
    refused = [line for line in result.stderr.replace("\n ", " ").splitlines() if line.startswith("error:")]
    assert refused == [f"error: {folder / name} is a file migrate did not write (written.json beside it has no record "
                       "of it); nothing was written. Move it, or name another report folder with --report-dir, or "
                       f"pass --force to write the reports, your file kept as {name}.bak first"
                       for name in ("report.md", "findings.csv")]
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == mine
    forced = migrate(original, *options, "--force")
    assert forced.exit_code == 0, forced.stderr
    assert f"--force: {folder / 'report.md'} not written by migrate; kept as {folder / 'report.md.bak'}" in (
        forced.stderr.replace("\n", ""))
    assert (folder / "report.md.bak").read_bytes() == mine["report.md"]
    assert (folder / "findings.csv.bak").read_bytes() == mine["findings.csv"]
    assert (folder / "keep.txt").read_bytes() == mine["keep.txt"]
    assert (folder / "report.md").read_bytes().startswith(b"# npu-port migrate report")
    assert migrate(original, *options).exit_code == 0  # the reports are migrate's own now
    (folder / "findings.csv").write_bytes(b"edited\n")
    again = migrate(original, *options)
    assert again.exit_code == 2 and f"{folder / 'findings.csv'} was changed since migrate wrote it" in again.stderr


def test_a_written_json_that_is_not_migrates_record_is_the_users(tmp_path):
    original = write(tmp_path / "train.py", SCRIPT)
    user = write(tmp_path / "out" / "written.json", b'{"mine": true}\n')
    result = migrate(original, "--report-dir", tmp_path / "out")
    assert result.exit_code == 2 and f"{user} is a file migrate did not write" in result.stderr.replace("\n", "")
    assert migrate(original, "--report-dir", tmp_path / "out", "--force").exit_code == 0
    assert (tmp_path / "out" / "written.json.bak").read_bytes() == b'{"mine": true}\n'
    assert b'"files"' in user.read_bytes()


def test_check_and_diff_read_an_edited_port_without_refusing(tmp_path):
    original = write(tmp_path / "again.py", SCRIPT)
    assert migrate(original).exit_code == 0
    edited(tmp_path / "again_npu.py")
    assert migrate(original, "--check").exit_code == 1  # writes nothing: nothing to refuse


def test_porting_a_port_again_is_refused_in_one_line_and_writes_nothing(tmp_path):
    """Issue 36: `migrate again_npu.py` wrote again_npu_npu_report/, a report of a report."""
    assert migrate(write(tmp_path / "again.py", SCRIPT)).exit_code == 0
    before = sorted(path.name for path in tmp_path.iterdir())
    port = tmp_path / "again_npu.py"
    result = migrate(port)
    assert result.exit_code == 2
    assert result.stderr.replace("\n", "") == (
        f"error: {port} is a port migrate wrote ({tmp_path / 'again_npu_report' / 'written.json'} records it): nothing "
        "was written; port its original instead (a port you edited is kept unless --force), or name an output with -o")
    assert sorted(path.name for path in tmp_path.iterdir()) == before  # no again_npu_npu_report/
    (tmp_path / "again_npu_report" / "written.json").unlink()  # a port from before migrate kept its record
    assert "again_npu_report/ is beside it" in migrate(port).stderr.replace("\n", "")
    assert migrate(port, "--check").exit_code == 0  # reading a port is no port of it: nothing left to port


def test_a_file_of_a_folders_port_is_refused_as_a_port(tmp_path):
    write(tmp_path / "src" / "train.py", SCRIPT)
    assert migrate(tmp_path / "src").exit_code == 0
    result = migrate(tmp_path / "src_npu" / "train.py")
    assert result.exit_code == 2 and "src_npu_report/written.json records it" in result.stderr.replace("\n", "")
    assert not (tmp_path / "src_npu" / "train_npu.py").exists()


def test_a_folder_port_names_the_ports_and_symlinked_folders_it_leaves_out(tmp_path):
    write(tmp_path / "proj" / "train.py", SCRIPT)
    write(tmp_path / "proj" / "lib" / "layers.py", SCRIPT)
    write(tmp_path / "outside" / "data.py", SCRIPT)
    assert migrate(tmp_path / "proj" / "train.py").exit_code == 0  # proj/train_npu.py and its report
    assert migrate(tmp_path / "proj" / "lib").exit_code == 0  # proj/lib_npu/ and its report
    (tmp_path / "proj" / "linked").symlink_to(tmp_path / "outside", target_is_directory=True)
    result = migrate(tmp_path / "proj")
    assert result.exit_code == 0, result.stderr
    left_out = [line for line in result.stderr.replace("\n ", " ").splitlines() if line.startswith("left out:")]
    assert left_out == [
        f"left out: {tmp_path / 'proj' / 'lib_npu'}: an earlier port (its report folder is beside it), not ported "
        "again",
        f"left out: {tmp_path / 'proj' / 'linked'}: a symbolic link to a folder, not followed (it may lead out of the "
        f"folder or into a loop): port {tmp_path / 'outside'} on its own if needed",
        f"left out: {tmp_path / 'proj' / 'train_npu.py'}: an earlier port (its report folder is beside it), not ported "
        "again"]
    assert sorted(path.name for path in (tmp_path / "proj_npu").iterdir()) == ["lib", "train.py"]


def test_report_md_and_checklist_md_escape_file_names_and_messages(tmp_path):
    """Issue 43: a file name holding HTML or Markdown went raw into report.md and checklist.md."""
    original = write(tmp_path / "<img src=x>#.py", SCRIPT)
    broken = write(tmp_path / "## PASS <b>.py", b"import torch\ndef f(:\n")
    result = migrate(original, broken)
    assert result.exit_code == 2
    folder = tmp_path / "<img src=x>#_npu_report"
    report, checklist = (folder / "report.md").read_text(), (folder / "checklist.md").read_text()
    assert f"| `{original}` |" in report and "<b>" not in report.replace(f"`{broken}`", "")
    assert f"- {tmp_path}/\\#\\# PASS \\<b\\>.py:2:7: syntax error" in report.replace("\\_", "_")
    assert not re.search(r"(?<![\\/])<img", checklist) and "\\<img src=x\\>\\#" in checklist  # a path's is in code
