"""Which GPUs a command means: `-i 0,1`, a UUID, a PCI bus id, a CUDA index, `local`.

gpuenv addresses GPUs by NVML index (nvidia-smi's order). CUDA numbers them
differently: in its own order (fastest first, unless CUDA_DEVICE_ORDER=PCI_BUS_ID),
then renumbered by CUDA_VISIBLE_DEVICES, which may hold indices, UUIDs (or
prefixes of them) and MIG devices. A CUDA index is therefore mapped to a UUID
first, then to the NVML index that has that UUID.

CUDA_VISIBLE_DEVICES is parsed here with CUDA's rules: entries up to the first
invalid one count, a duplicate hides every GPU, at most one MIG device is
visible and a MIG device means its parent GPU (MIG slices share its clocks).
Only where that cannot tell CUDA's order (GPUs of mixed models without
CUDA_DEVICE_ORDER=PCI_BUS_ID) does nvitop's parser ask CUDA itself, on a real GPU:
it initialises CUDA in a subprocess, hundreds of ms before `gpuenv run` under
torchrun or CUDA_VISIBLE_DEVICES could start its command.

`own_gpus` is the one rule for the GPUs a process may use when none are named: every
door (stable(), gpuenv.lock, gpuenv lock/restore/check/run) calls it, through
`choose_gpus`. In order: torchrun's LOCAL_RANK (the rank's own CUDA device, under
CUDA_VISIBLE_DEVICES: narrower than the whole visible set, so a rank never takes its
neighbour's GPU), Slurm's SLURM_LOCALID for a task of several, CUDA_VISIBLE_DEVICES,
Slurm's GPUs for the step (SLURM_STEP_GPUS, else SLURM_JOB_GPUS), else every GPU.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from gpuenv.backend import Backend
from gpuenv.errors import ConfigError, DeviceNotFound, GpuenvError

_PCI = re.compile(
    r"^(?:(?P<domain>[0-9a-f]{1,8}):)?(?P<bus>[0-9a-f]{1,2}):(?P<dev>[0-9a-f]{1,2})\.(?P<fn>[0-7])$",
    re.IGNORECASE,
)
_MIG_BY_GPU = re.compile(r"^MIG-(?P<gpu>GPU-[0-9a-f-]+)/\d+/\d+$", re.IGNORECASE)
_LEADING_INT = re.compile(r"^[+-]?\d+")


def select_gpus(
    backend: Backend,
    selector: str | int | Sequence[str | int] | None = None,
    *,
    env: Mapping[str, str] | None = None,
) -> list[int]:
    """NVML indices of the GPUs that `selector` names, in the order given, without repeats.

    `selector`: None or "all" (every GPU); an NVML index (7 or "7"); a list ("0,1"
    or [0, 1]); a UUID ("GPU-5d3c...", any unique prefix); a PCI bus id
    ("00000000:18:00.0", "18:00.0"); "cuda:N" (CUDA's index N, honouring
    CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER); "local" (the CUDA index in
    LOCAL_RANK, as torchrun sets it). `env` replaces os.environ (for tests).

    Raises DeviceNotFound (naming the valid choices) or ConfigError.
    """
    env = os.environ if env is None else env
    count = backend.device_count()
    tokens = _tokens(selector)
    if not tokens:
        raise ConfigError("empty GPU selector", hint="use 'all', indices like 0,1, or a UUID")
    chosen: list[int] = []
    cuda: _CudaView | None = None
    for token in tokens:
        if isinstance(token, int) or token.isdigit():
            found = [_check_index(int(token), count)]
        elif token.lower() == "all":
            if count == 0:
                raise DeviceNotFound("all", 0)
            found = list(range(count))
        elif token.lower().startswith("cuda:") or token.lower() == "local":
            cuda = cuda or _CudaView(backend, env)
            found = [cuda.nvml_index(_cuda_ordinal(token, env), token)]
        elif token.upper().startswith("GPU-"):
            found = [_by_uuid(backend, token)]
        elif token.upper().startswith("MIG-"):
            index = _mig_parent(backend, token)
            if index is None:
                raise DeviceNotFound(token, count, hint="no MIG device has that UUID here")
            found = [index]
        elif _PCI.match(token):
            found = [_by_pci(backend, token)]
        else:
            raise DeviceNotFound(
                token,
                count,
                hint="use an index (0), 'all', a UUID (GPU-...), a PCI bus id "
                "(00000000:18:00.0), 'cuda:N' or 'local'",
            )
        for index in found:
            if index not in chosen:
                chosen.append(index)
    return chosen


class OwnGpus(NamedTuple):
    """The GPUs a door takes, and why, in words: `CUDA_VISIBLE_DEVICES=1 -> GPU 1`."""

    indices: list[int]
    why: str


def own_selector(env: Mapping[str, str]) -> str:
    """The selector (for `select_gpus`, under `own_env(env)`) naming this process's GPUs.

    Under torchrun (LOCAL_RANK) the rank's own GPU; under Slurm (SLURM_LOCALID) the
    task's only visible GPU, or the one at its local id; otherwise the GPUs
    CUDA_VISIBLE_DEVICES shows; else Slurm's GPUs for the step or job (NVML indices,
    as Slurm numbers them); else all.
    """
    if env.get("LOCAL_RANK", "").strip():
        return "local"
    visible = [v for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if env.get("SLURM_LOCALID", "").strip():
        return "cuda:0" if len(visible) == 1 else "local"
    if "CUDA_VISIBLE_DEVICES" in env:
        return ",".join(f"cuda:{k}" for k in range(len(visible))) or "cuda:0"
    slurm = _slurm_gpus(env)
    if slurm is not None:
        return env[slurm]
    return "all"


def own_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment for select_gpus: SLURM_LOCALID stands in for a missing LOCAL_RANK."""
    out = dict(env)
    if not out.get("LOCAL_RANK", "").strip() and out.get("SLURM_LOCALID", "").strip():
        out["LOCAL_RANK"] = out["SLURM_LOCALID"]
    return out


def own_gpus(backend: Backend, env: Mapping[str, str] | None = None) -> OwnGpus:
    """The GPUs this process may use, and why (the module's docstring gives the order).

    `env` replaces os.environ (for tests). Raises DeviceNotFound where the environment
    names no GPU of this machine (CUDA_VISIBLE_DEVICES="" or one that does not exist).
    """
    env = os.environ if env is None else env
    selector = own_selector(env)
    indices = select_gpus(backend, selector, env=own_env(env))
    return OwnGpus(indices, f"{_own_source(env)} -> {gpu_words(indices)}")


def choose_gpus(
    backend: Backend,
    selector: str | int | Sequence[str | int] | None,
    *,
    env: Mapping[str, str] | None = None,
    named: str = "gpus",
) -> OwnGpus:
    """The GPUs a door takes: `selector`'s (`select_gpus`), or this process's own
    (`own_gpus`) when it is None. `named` is how the why names an explicit selector:
    "gpus" (`gpus='all' -> GPU 0, 1`) or a flag such as "-i" (`-i all -> GPU 0, 1`)."""
    if selector is None:
        return own_gpus(backend, env)
    indices = select_gpus(backend, selector, env=env)
    text = ",".join(map(str, selector)) if isinstance(selector, (list, tuple)) else selector
    said = f"{named} {text}" if named.startswith("-") else f"{named}={text!r}"
    return OwnGpus(indices, f"{said} -> {gpu_words(indices)}")


def gpu_words(indices: Sequence[int]) -> str:
    """'GPU 1', 'GPU 0, 1', 'no GPU'."""
    return f"GPU {', '.join(map(str, indices))}" if indices else "no GPU"


def select_recorded(
    gpus: Sequence[Mapping[str, object]], selector: str | int | Sequence[str | int] | None
) -> list[int]:
    """NVML indices among GPUs a run recorded (each a dict with "index" and, where known,
    "uuid" and "pci_bus_id"), named as `select_gpus` names them: an index, a UUID or a
    unique prefix, a PCI bus id, 'all'. CUDA's numbering ('cuda:N', 'local') belongs to
    the machine that ran it, not to the file, so it is refused."""
    try:
        indices = [int(str(g.get("index"))) for g in gpus]
    except (AttributeError, TypeError, ValueError):
        raise ConfigError(
            "this run's list of GPUs is damaged (an entry without an NVML index)",
            hint="plot it without -i (each measurement's first GPU), or write it again",
        ) from None
    uuids = [str(g.get("uuid") or "") for g in gpus]
    known = ", ".join(map(str, indices)) or "none"
    chosen: list[int] = []
    for token in _tokens(selector):
        text = str(token).strip()
        if text.lower() == "all":
            found = list(indices)
        elif text.lstrip("+").isdigit() and int(text) in indices:
            found = [int(text)]
        elif text.upper().startswith("GPU-") and (hit := _match_uuid(uuids, text)) is not None:
            found = [indices[hit]]
        elif _PCI.match(text) and (
            hits := [
                i
                for i, g in zip(indices, gpus, strict=True)
                if _pci_key(str(g.get("pci_bus_id") or "")) == _pci_key(text)
            ]
        ):
            found = hits[:1]
        else:
            raise ConfigError(
                f"this run has no GPU {text}",
                hint=f"it recorded GPU {known}: give one of those indices, a UUID or a PCI bus id",
            )
        chosen += [i for i in found if i not in chosen]
    return chosen


def describe(backend: Backend, index: int) -> str:
    """'GPU 0 (NVIDIA H100 80GB HBM3)', or 'GPU 0' when the name cannot be read."""
    try:
        return f"GPU {index} ({backend.device_info(index).name})"
    except GpuenvError:
        return f"GPU {index}"


def cuda_visible(backend: Backend, *, env: Mapping[str, str] | None = None) -> list[int]:
    """NVML indices of the GPUs CUDA would see, in CUDA's order (cuda:0 first)."""
    return _CudaView(backend, os.environ if env is None else env).visible()


# -- helpers ----------------------------------------------------------------------------

_SLURM_GPUS = ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS")


def _slurm_gpus(env: Mapping[str, str]) -> str | None:
    """The name of the Slurm variable that lists this step's (else job's) GPUs, if set."""
    return next((k for k in _SLURM_GPUS if env.get(k, "").strip()), None)


def _own_source(env: Mapping[str, str]) -> str:
    """What in the environment `own_selector` followed, as `NAME=value` words."""
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    under = f" under CUDA_VISIBLE_DEVICES={cvd}" if cvd is not None else ""
    if env.get("LOCAL_RANK", "").strip():
        return f"LOCAL_RANK={env['LOCAL_RANK'].strip()}{under}"
    if env.get("SLURM_LOCALID", "").strip():
        return f"SLURM_LOCALID={env['SLURM_LOCALID'].strip()}{under}"
    if cvd is not None:
        return f"CUDA_VISIBLE_DEVICES={cvd}"
    slurm = _slurm_gpus(env)
    if slurm is not None:
        return f"{slurm}={env[slurm].strip()}"
    return "no CUDA_VISIBLE_DEVICES, LOCAL_RANK or Slurm GPUs: every GPU"


def _tokens(selector: str | int | Sequence[str | int] | None) -> list[str | int]:
    if selector is None:
        return ["all"]
    if isinstance(selector, bool):
        raise ConfigError(f"GPU selector {selector!r} is not understood", hint="use 'all' or 0,1")
    if isinstance(selector, int):
        return [selector]
    items: Sequence[str | int] = [selector] if isinstance(selector, str) else selector
    tokens: list[str | int] = []
    for item in items:
        if isinstance(item, int) and not isinstance(item, bool):
            tokens.append(item)
            continue
        if not isinstance(item, str):
            raise ConfigError(f"GPU selector {item!r} is not understood", hint="use 'all' or 0,1")
        tokens.extend(part.strip() for part in item.split(",") if part.strip())
    return tokens


def _check_index(index: int, count: int) -> int:
    if not 0 <= index < count:
        raise DeviceNotFound(str(index), count)
    return index


def _uuids(backend: Backend) -> list[str]:
    return [backend.device_info(i).uuid for i in range(backend.device_count())]


def _match_uuid(uuids: list[str], token: str) -> int | None:
    """Index of the GPU whose UUID equals or starts with `token`; None if none; error if several."""
    want = token.lower()
    exact = [i for i, u in enumerate(uuids) if u.lower() == want]
    if exact:
        return exact[0]
    hits = [i for i, u in enumerate(uuids) if u.lower().startswith(want)]
    if len(hits) > 1:
        raise ConfigError(
            f"GPU selector {token!r} matches {len(hits)} GPUs",
            hint="give more characters of the UUID ('gpuenv status' lists them)",
        )
    return hits[0] if hits else None


def _by_uuid(backend: Backend, token: str) -> int:
    index = _match_uuid(_uuids(backend), token)
    if index is None:
        raise DeviceNotFound(token, backend.device_count())
    return index


def _pci_key(text: str) -> tuple[int, int, int, int] | None:
    m = _PCI.match(text.strip())
    if m is None:
        return None
    return (int(m["domain"] or "0", 16), int(m["bus"], 16), int(m["dev"], 16), int(m["fn"], 16))


def _by_pci(backend: Backend, token: str) -> int:
    want = _pci_key(token)
    for i in range(backend.device_count()):
        if _pci_key(backend.device_info(i).pci_bus_id) == want:
            return i
    raise DeviceNotFound(token, backend.device_count())


def _mig_parent(backend: Backend, token: str) -> int | None:
    """The NVML index of the GPU holding MIG device `token`; None if unknown."""
    m = _MIG_BY_GPU.match(token)
    if m is not None:  # MIG-GPU-<uuid>/<gi>/<ci>: the parent's UUID is in the name
        return _match_uuid(_uuids(backend), m["gpu"])
    index = backend.mig_parent_index(token)  # only NVML can resolve a MIG UUID
    return int(index) if index is not None else None


def _cuda_ordinal(token: str, env: Mapping[str, str]) -> int:
    if token.lower() == "local":
        raw = env.get("LOCAL_RANK")
        if raw is None:
            raise ConfigError(
                "'local' needs LOCAL_RANK, which is not set",
                hint="run under torchrun (or another launcher that sets it), or name GPUs: -i 0,1",
            )
        what = f"LOCAL_RANK={raw!r}"
        text = raw.strip()
    else:
        what = repr(token)
        text = token[len("cuda:") :].strip()
    if not text.isdigit():
        raise ConfigError(f"{what} is not a CUDA index", hint="use a number, as in cuda:0")
    return int(text)


class _CudaView:
    """How CUDA numbers the GPUs, under CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER."""

    def __init__(self, backend: Backend, env: Mapping[str, str]):
        self.backend = backend
        self.env = env
        self._visible: list[int] | None = None

    def nvml_index(self, ordinal: int, token: str) -> int:
        visible = self.visible()
        if ordinal < len(visible):
            return visible[ordinal]
        cvd = self.env.get("CUDA_VISIBLE_DEVICES")
        seen = f"CUDA sees {len(visible)} GPU{'s' if len(visible) != 1 else ''}"
        if cvd is not None:
            seen += f" with CUDA_VISIBLE_DEVICES={cvd!r}"
        raise DeviceNotFound(
            token,
            self.backend.device_count(),
            hint=f"{seen}; valid: "
            + (", ".join(f"cuda:{i}" for i in range(len(visible))) or "none"),
        )

    def visible(self) -> list[int]:
        if self._visible is None:
            try:  # CUDA's rules without CUDA: nvitop's answer costs a CUDA init in a subprocess
                self._visible = self._parse()
            except ConfigError:  # mixed models in FASTEST_FIRST order: only CUDA knows it
                found = self._from_nvitop()
                if found is None:
                    raise
                self._visible = found
        return self._visible

    def _from_nvitop(self) -> list[int] | None:
        """Ask CUDA through nvitop (real GPUs only): UUIDs in CUDA's order, mapped by UUID."""
        if self.backend.capabilities.simulated:
            return None
        try:
            from nvitop.api.device import normalize_cuda_visible_devices
        except ImportError:
            return None
        try:
            joined = normalize_cuda_visible_devices(self.env.get("CUDA_VISIBLE_DEVICES"))
        except Exception:  # nvitop could not run CUDA or NVML here: parse it ourselves
            return None
        uuids = _uuids(self.backend)
        result: list[int] = []
        for uuid in filter(None, joined.split(",")):
            index = (
                _mig_parent(self.backend, uuid)
                if uuid.upper().startswith("MIG-")
                else _match_uuid(uuids, uuid)
            )
            if index is None:
                return None
            if index not in result:
                result.append(index)
        return result or None

    def _base_order(self) -> list[int]:
        """NVML indices in CUDA's order before CUDA_VISIBLE_DEVICES: by PCI bus id.

        That is CUDA's order under CUDA_DEVICE_ORDER=PCI_BUS_ID, and under the default
        FASTEST_FIRST when all GPUs are the same model. Mixed models without PCI_BUS_ID
        cannot be ordered without asking CUDA, so that is an error rather than a guess.
        """
        count = self.backend.device_count()
        infos = [self.backend.device_info(i) for i in range(count)]
        order = self.env.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST").strip().upper()
        if order != "PCI_BUS_ID" and len({info.name for info in infos}) > 1:
            raise ConfigError(
                "cannot tell CUDA's order of these mixed GPU models without CUDA",
                hint="set CUDA_DEVICE_ORDER=PCI_BUS_ID, or select GPUs by UUID or NVML index",
            )
        return sorted(range(count), key=lambda i: _pci_key(infos[i].pci_bus_id) or (0, 0, 0, i))

    def _parse(self) -> list[int]:
        value = self.env.get("CUDA_VISIBLE_DEVICES")
        if value is None:
            return self._base_order()
        base: list[int] | None = None
        uuids: list[str] | None = None
        result: list[int] = []
        mig: list[int] = []
        style: str | None = None  # CUDA does not mix indices and UUIDs: stop where they change
        for raw in value.split(","):
            token = raw.strip()
            m = _LEADING_INT.match(token)
            if m is not None:
                if style not in (None, "index"):
                    break
                style = "index"
                base = self._base_order() if base is None else base
                ordinal = int(m.group())
                if not 0 <= ordinal < len(base):
                    break
                index = base[ordinal]
            elif token.upper().startswith("GPU-"):
                if style not in (None, "uuid"):
                    break
                style = "uuid"
                uuids = _uuids(self.backend) if uuids is None else uuids
                try:
                    found = _match_uuid(uuids, token)
                except ConfigError:  # an ambiguous prefix is invalid for CUDA too
                    break
                if found is None:
                    break
                index = found
            elif token.upper().startswith("MIG-"):
                if style not in (None, "uuid"):
                    break
                style = "uuid"
                parent = _mig_parent(self.backend, token)
                if parent is None:
                    break
                mig.append(parent)
                continue
            else:
                break
            if index in result:
                return []  # a duplicate makes CUDA see no device at all
            result.append(index)
        if mig:
            return mig[:1]  # CUDA shows at most one MIG device
        return result
