"""The operations files gpuenv ships, and their installation: `gpuenv ops`.

gpuenvd's systemd unit, the Slurm prolog and epilog, the Prometheus rules (with their
promtool tests, and the scrape jobs that run beside dcgm-exporter) and the Grafana
dashboard live in this package, beside this module: one copy, the same in a checkout and
in an installed wheel, so a machine that got gpuenv from a wheel can set up gpuenvd and
Slurm too.

    gpuenv ops list                     each file, where it goes, what it is for
    gpuenv ops show unit                the file on standard output (`systemctl cat`'s way)
    gpuenv ops install prolog epilog    into its usual place (/etc/slurm), or --dest DIR

An install never leaves half a file: the bytes go to a new file of an unpredictable name
in the destination, flushed to disk, then linked to their name (or renamed over it with
`force`), so a full disk or a crash leaves the place as it was. A file already there is
kept unless `force`, except one byte for byte the same, mode included, which is left as
it is (installing twice is not an error).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from gpuenv import validate
from gpuenv._files import create_temp, naming, read_at, write_all
from gpuenv.errors import ConfigError, FileError


@dataclass(frozen=True)
class OpsFile:
    """One shipped file. `resource`: its path in this package; `file`: its name once
    installed; `folder`: where it usually goes (None: nowhere usual, `--dest` says);
    `then`: what to do once it is installed ({path} and {folder} filled in); `runs`: the
    gpuenv it runs, as it names it (looked up in ROOT_PATH), where it runs one."""

    name: str
    resource: str
    file: str
    folder: str | None
    mode: int
    what: str
    then: str
    runs: str | None = None


# where the Slurm scripts look for commands (they set it: slurmd gives them no PATH)
ROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


FILES: dict[str, OpsFile] = {
    f.name: f
    for f in (
        OpsFile(
            "unit",
            "systemd/gpuenvd.service",
            "gpuenvd.service",
            "/etc/systemd/system",
            0o644,
            "gpuenvd's systemd unit",
            "systemctl daemon-reload && systemctl enable --now gpuenvd",
            runs="/usr/local/bin/gpuenv",  # its ExecStart
        ),
        OpsFile(
            "prolog",
            "slurm/prolog.sh",
            "gpuenv-prolog.sh",
            "/etc/slurm",
            0o755,
            "Slurm Prolog: locks the clocks",
            "add Prolog={path} to slurm.conf, then scontrol reconfigure",
            runs="gpuenv",
        ),
        OpsFile(
            "epilog",
            "slurm/epilog.sh",
            "gpuenv-epilog.sh",
            "/etc/slurm",
            0o755,
            "Slurm Epilog: puts them back",
            "add Epilog={path} to slurm.conf, then scontrol reconfigure",
            runs="gpuenv",
        ),
        OpsFile(
            "rules",
            "prometheus/gpuenv.rules.yml",
            "gpuenv.rules.yml",
            "/etc/prometheus",
            0o644,
            "Prometheus alert rules",
            "list {path} under rule_files in prometheus.yml; promtool check rules {path}",
        ),
        OpsFile(
            "rules-test",
            "prometheus/gpuenv.rules.test.yml",
            "gpuenv.rules.test.yml",
            "/etc/prometheus",
            0o644,
            "promtool tests of the rules",
            "cd {folder} && promtool test rules gpuenv.rules.test.yml (beside the rules)",
        ),
        OpsFile(
            "scrape",
            "prometheus/dcgm-scrape.yml",
            "gpuenv-dcgm-scrape.yml",
            None,
            0o644,
            "scrapes beside dcgm-exporter",
            "merge its two jobs into the scrape_configs of prometheus.yml, with your nodes",
        ),
        OpsFile(
            "dashboard",
            "grafana/gpuenv-dashboard.json",
            "gpuenv-dashboard.json",
            None,
            0o644,
            "Grafana dashboard",
            "import {path} in Grafana (Dashboards > New > Import), or let a dashboards "
            "provider read {folder}",
        ),
    )
}
NAMES = tuple(FILES)


@dataclass(frozen=True)
class Installed:
    """What `install` did: `action` is "installed", "replaced" or "unchanged"."""

    file: OpsFile
    path: str
    action: str

    @property
    def then(self) -> str:
        """The next step, for this path."""
        return self.file.then.format(path=self.path, folder=os.path.dirname(self.path))

    @property
    def note(self) -> str | None:
        """What the installed file will not find: the gpuenv it runs (a wheel installed in
        a virtual environment is on no path root's services look in), or None."""
        runs = self.file.runs
        if runs is None or shutil.which(runs, path=ROOT_PATH):
            return None
        mine = os.path.join(sysconfig.get_path("scripts"), "gpuenv")
        link = mine if os.access(mine, os.X_OK) else "/path/to/venv/bin/gpuenv"
        return (
            f"it runs {runs}, which root's services will not find: "
            f"ln -s {link} /usr/local/bin/gpuenv"
        )


def find(name: str) -> OpsFile:
    """The shipped file called `name` (one of NAMES)."""
    return FILES[validate.choice(name, "name", NAMES)]


def packaged(name: str) -> Path:
    """Where this package holds `name`'s file (read it with `read`): for tools that want
    a path, such as promtool or a test that runs the prolog in place."""
    return Path(__file__).parent / find(name).resource


def read(name: str) -> bytes:
    """The bytes of `name`'s file, as `gpuenv ops show NAME` prints them."""
    path = packaged(name)
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(
            f"gpuenv's {name} file is missing from its installation ({path})",
            hint="reinstall gpuenv from a checkout (pip install .) or from a wheel built by "
            "python -m build, which holds it",
        ) from None


def install(
    name: str, dest: str | os.PathLike[str] | None = None, *, force: bool = False
) -> Installed:
    """Write `name`'s file into the directory `dest` (default: its usual place), mode set
    as the file needs it (0755 for the Slurm scripts) whatever the umask, as
    `install -m` does; never half a file (see the module docstring).

    A different file already there is refused (ConfigError, naming how it differs) unless
    `force`. No directory is created: a missing one is a FileError, as a read-only one, a
    full disk or no permission are (each naming the path and what to do).
    """
    entry = find(name)
    validate.boolean(force, "force")
    folder = validate.path_like(dest, "dest") if dest is not None else entry.folder
    if folder is None:
        raise ConfigError(
            f"the {name} file has no usual place to go",
            hint=f"give one (gpuenv ops install {name} --dest DIR), or print it: "
            f"gpuenv ops show {name}",
        )
    path = os.path.join(os.path.abspath(folder), entry.file)
    data = read(name)
    try:
        dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as err:
        raise FileError.from_os_error(naming(err, folder), where=f"installing {name}") from err
    try:
        differs = _differs(dfd, entry, data, path)
        if differs == "":
            return Installed(entry, path, "unchanged")
        if differs is not None and not force:
            raise _exists(entry, path, differs)
        _place(dfd, entry, data, path, replace=differs is not None)
    except OSError as err:
        raise FileError.from_os_error(naming(err, path), where=f"installing {name}") from err
    finally:
        os.close(dfd)
    return Installed(entry, path, "installed" if differs is None else "replaced")


def _differs(dfd: int, entry: OpsFile, data: bytes, path: str) -> str | None:
    """How the file at `entry.file` differs from ours: None when there is none, "" when
    it is the same (bytes and mode), else a few words."""
    try:
        st = os.stat(entry.file, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if stat.S_ISDIR(st.st_mode):
        raise ConfigError(
            f"{path} is a directory", hint="remove it, or install somewhere else (--dest DIR)"
        )
    if not stat.S_ISREG(st.st_mode):
        return "it is not a regular file (a symbolic link?)"
    if read_at(dfd, entry.file) != data:
        return "its text differs: a local edit, or another gpuenv version's"
    mode = stat.S_IMODE(st.st_mode)
    if mode != entry.mode:
        return f"its mode is {mode:04o}, not {entry.mode:04o}"
    return ""


def _exists(entry: OpsFile, path: str, differs: str) -> ConfigError:
    return ConfigError(
        f"{path} already exists and is not gpuenv's {entry.name} file ({differs})",
        hint=f"see how with 'diff <(gpuenv ops show {entry.name}) {path}'; --force replaces it",
    )


def _place(dfd: int, entry: OpsFile, data: bytes, path: str, *, replace: bool) -> None:
    """`data` under `entry.file` in `dfd`, whole: a temporary file, flushed, then renamed
    over the old file (`replace`) or linked to the name, which fails if one appeared."""
    fd, tmp = create_temp(dfd, entry.file, entry.mode)
    try:
        try:
            os.fchmod(fd, entry.mode)  # exactly: the umask took bits create_temp asked for
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        if replace:
            os.replace(tmp, entry.file, src_dir_fd=dfd, dst_dir_fd=dfd)
        else:
            _link(dfd, tmp, entry, path)
        with contextlib.suppress(OSError):  # a directory that cannot be synced (EINVAL)
            os.fsync(dfd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dfd)
        raise


def _link(dfd: int, tmp: str, entry: OpsFile, path: str) -> None:
    """The new file under its name only where none is there: a link fails with EEXIST
    where a rename would replace what appeared since we looked."""
    try:
        os.link(tmp, entry.file, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
    except FileExistsError:
        raise _exists(entry, path, "it appeared while gpuenv was installing its own") from None
    except OSError as err:
        # a file system without hard links (vfat): rename, as nothing was there a moment ago
        if err.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
        os.replace(tmp, entry.file, src_dir_fd=dfd, dst_dir_fd=dfd)
        return
    os.unlink(tmp, dir_fd=dfd)


__all__ = ["FILES", "NAMES", "Installed", "OpsFile", "find", "install", "packaged", "read"]
