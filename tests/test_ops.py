"""gpuenv/ops: the operations files shipped in the package, and `gpuenv ops` listing,
printing and installing them (whole or not at all, never over a file that differs)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pwd
import shutil
import stat
import sysconfig
from pathlib import Path

import pytest
from click.testing import CliRunner
from tmpfs_harness import tmpfs

from gpuenv import ops
from gpuenv.cli import cli
from gpuenv.errors import ConfigError, FileError

PACKAGE_OPS = Path(ops.__file__).parent


def gpuenv(*args: str):
    return CliRunner().invoke(cli, list(args))


def test_every_file_in_the_package_is_one_gpuenv_ops_knows_and_the_other_way_round() -> None:
    shipped = {
        p.relative_to(PACKAGE_OPS).as_posix()
        for p in PACKAGE_OPS.rglob("*")
        if p.is_file() and p.suffix not in (".py", ".pyc")
    }
    assert shipped == {f.resource for f in ops.FILES.values()}
    assert len({f.file for f in ops.FILES.values()}) == len(ops.FILES)


def test_list_names_each_file_and_where_it_goes() -> None:
    out = gpuenv("ops", "list")
    assert out.exit_code == 0, out.output
    assert gpuenv("ops").output == out.output  # alone, it lists
    lines = out.output.splitlines()
    assert lines[0].split() == ["NAME", "FILE", "GOES", "TO", "WHAT"]
    assert [line.split()[0] for line in lines[1:]] == list(ops.NAMES)
    assert lines[1].split()[:3] == ["unit", "gpuenvd.service", "/etc/systemd/system"]
    assert max(len(line) for line in lines) <= 88  # a docs page shows it whole


@pytest.mark.parametrize("name", ops.NAMES)
def test_show_prints_the_packaged_file_byte_for_byte(name: str) -> None:
    out = CliRunner().invoke(cli, ["ops", "show", name])
    assert out.exit_code == 0, out.output
    assert out.stdout_bytes == ops.packaged(name).read_bytes() != b""


def test_an_unknown_name_is_refused_with_the_names_there_are() -> None:
    out = gpuenv("ops", "show", "units")
    assert out.exit_code == 2
    assert "'units' is not one of 'unit', 'prolog'" in out.output
    with pytest.raises(ConfigError, match="name must be one of 'unit'"):
        ops.install("units", "/tmp")


def test_install_writes_each_file_with_its_mode_and_says_what_next(tmp_path: Path) -> None:
    old = os.umask(0o077)  # a strict umask must not cost the scripts their x bit
    try:
        out = gpuenv("ops", "install", "prolog", "epilog", "unit", "--dest", str(tmp_path))
    finally:
        os.umask(old)
    assert out.exit_code == 0, out.output
    for name, mode in (("prolog", 0o755), ("epilog", 0o755), ("unit", 0o644)):
        path = tmp_path / ops.FILES[name].file
        assert path.read_bytes() == ops.read(name)
        assert stat.S_IMODE(path.stat().st_mode) == mode
    assert f"installed {tmp_path}/gpuenv-prolog.sh\n  next: add Prolog={tmp_path}/" in out.output
    assert "systemctl daemon-reload" in out.output
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "gpuenv-epilog.sh",
        "gpuenv-prolog.sh",
        "gpuenvd.service",
    ]  # no temporary file left


def test_a_file_that_runs_gpuenv_says_so_where_root_would_not_find_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wheel in a virtual environment is on no path root's services search: the unit's
    ExecStart and the Slurm scripts would fail at their first run, not at install."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setattr(ops, "ROOT_PATH", str(bin_dir))
    prolog = ops.install("prolog", tmp_path)
    assert prolog.note is not None
    assert prolog.note.startswith("it runs gpuenv, which root's services will not find: ln -s ")
    assert prolog.note.endswith(" /usr/local/bin/gpuenv")
    out = gpuenv("ops", "install", "epilog", "--dest", str(tmp_path))
    assert "\n  note: it runs gpuenv, which root's services will not find" in out.output
    (bin_dir / "gpuenv").write_text("#!/bin/sh\n")
    (bin_dir / "gpuenv").chmod(0o755)
    assert prolog.note is None
    assert ops.install("rules", tmp_path).note is None  # it runs nothing of gpuenv's
    unit = dataclasses.replace(ops.FILES["unit"], runs=str(tmp_path / "gone" / "gpuenv"))
    assert ops.Installed(unit, "x", "installed").note == (
        f"it runs {tmp_path}/gone/gpuenv, which root's services will not find: "
        f"ln -s {Path(sysconfig.get_path('scripts')) / 'gpuenv'} /usr/local/bin/gpuenv"
    )


def test_installing_again_leaves_the_same_file_and_refuses_one_that_differs(
    tmp_path: Path,
) -> None:
    assert ops.install("unit", tmp_path).action == "installed"
    assert ops.install("unit", tmp_path).action == "unchanged"
    unit = tmp_path / "gpuenvd.service"
    unit.write_text(unit.read_text().replace("Nice=-10", "Nice=0"))
    out = gpuenv("ops", "install", "unit", "--dest", str(tmp_path))
    assert out.exit_code == 2, out.output
    assert f"{unit} already exists and is not gpuenv's unit file (its text differs" in out.output
    assert "--force replaces it" in out.output
    assert "Nice=0" in unit.read_text()  # kept
    out = gpuenv("ops", "install", "unit", "--dest", str(tmp_path), "--force")
    assert out.exit_code == 0 and out.output.startswith(f"replaced {unit}")
    assert unit.read_bytes() == ops.read("unit")


def test_a_mode_that_differs_is_a_difference_too(tmp_path: Path) -> None:
    ops.install("prolog", tmp_path)
    script = tmp_path / "gpuenv-prolog.sh"
    script.chmod(0o644)  # slurmd could not run it
    with pytest.raises(ConfigError, match="its mode is 0644, not 0755"):
        ops.install("prolog", tmp_path)
    assert ops.install("prolog", tmp_path, force=True).action == "replaced"
    assert stat.S_IMODE(script.stat().st_mode) == 0o755


def test_a_link_in_the_way_is_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "gpuenvd.service").symlink_to(victim)
    with pytest.raises(ConfigError, match="not a regular file"):
        ops.install("unit", dest)
    ops.install("unit", dest, force=True)
    assert victim.read_text() == "keep me\n"  # the link was replaced, not written through
    assert (dest / "gpuenvd.service").read_bytes() == ops.read("unit")


def test_a_file_that_appears_while_installing_is_not_overwritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check and the write are apart: what appeared between them is kept (a link,
    not a rename, puts the new file in place)."""
    real_write_all = ops.write_all

    def write_then_race(fd: int, data: bytes) -> None:
        real_write_all(fd, data)
        (tmp_path / "gpuenvd.service").write_text("someone else's\n")

    monkeypatch.setattr(ops, "write_all", write_then_race)
    with pytest.raises(ConfigError, match="appeared while gpuenv was installing"):
        ops.install("unit", tmp_path)
    assert (tmp_path / "gpuenvd.service").read_text() == "someone else's\n"
    assert [p.name for p in tmp_path.iterdir()] == ["gpuenvd.service"]


def test_files_with_no_usual_place_need_a_destination(tmp_path: Path) -> None:
    out = gpuenv("ops", "install", "dashboard")
    assert out.exit_code == 2
    assert "no usual place to go: give one (gpuenv ops install dashboard --dest DIR)" in (
        out.output
    )
    done = ops.install("dashboard", tmp_path)
    assert done.then.startswith(f"import {tmp_path}/gpuenv-dashboard.json in Grafana")


def test_a_missing_directory_or_a_directory_in_the_way_is_named(tmp_path: Path) -> None:
    out = gpuenv("ops", "install", "unit", "--dest", "")
    assert out.exit_code == 2 and "--dest must be a path (a non-empty string)" in out.output
    out = gpuenv("ops", "install", "unit", "--dest", str(tmp_path / "nope"))
    assert out.exit_code == 2
    assert f"installing unit: {tmp_path / 'nope'} does not exist" in out.output
    (tmp_path / "gpuenvd.service").mkdir()
    with pytest.raises(ConfigError, match=r"gpuenvd\.service is a directory"):
        ops.install("unit", tmp_path, force=True)


def test_an_account_that_may_not_write_there_exits_4_naming_the_place() -> None:
    """`gpuenv ops install unit` without sudo: /etc/systemd/system is root's."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run it as another account (CI runs as root)")
    from daemon_harness import run_as, shared_workdir

    work = shared_workdir()
    try:
        dest = work / "system"
        dest.mkdir(mode=0o755)  # root's: others may look, not write
        code = "import sys\nfrom gpuenv.cli import main\nsys.argv[0] = 'gpuenv'\nmain()\n"
        argv = ("ops", "install", "unit", "--dest", str(dest))
        out = run_as(pwd.getpwnam("nobody"), code, *argv, env=dict(os.environ))
        assert list(dest.iterdir()) == []
    finally:
        shutil.rmtree(work)
    assert out.returncode == 4, out.stderr
    assert f"installing unit: permission denied on {dest}/gpuenvd.service" in out.stderr


def test_a_full_disk_leaves_no_part_of_a_file(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", "size=64k") as disk:
        with contextlib.suppress(OSError), open(disk / "filler", "wb") as f:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
        (disk / "filler").write_bytes((disk / "filler").read_bytes()[:-8192])
        out = gpuenv("ops", "install", "dashboard", "--dest", str(disk))  # 14 KiB
        assert out.exit_code == 2, out.output
        assert f"the disk holding {disk}/gpuenv-dashboard.json is full" in out.output
        assert sorted(p.name for p in disk.iterdir()) == ["filler"]


def test_a_read_only_place_is_named(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "ro", "size=64k,ro") as place, pytest.raises(FileError) as err:
        ops.install("unit", place)
    assert str(err.value).startswith(
        f"installing unit: {place}/gpuenvd.service is on a read-only file system"
    )
