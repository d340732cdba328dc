"""GPU selection on a simulated 4-GPU machine: indices, UUIDs, PCI ids, CUDA indices."""

from __future__ import annotations

import dataclasses

import pytest

from gpuenv.backend.sim import SimBackend
from gpuenv.backend.sim_profiles import get_profile
from gpuenv.devices import choose_gpus, cuda_visible, describe, own_gpus, select_gpus
from gpuenv.errors import ConfigError, DeviceNotFound
from gpuenv.timebase import VirtualClock

pytestmark = pytest.mark.sim_gpus(4)


@pytest.fixture
def shuffled() -> SimBackend:
    """NVML order differs from PCI order: NVML 0 sits on the highest bus."""
    profile = dataclasses.replace(
        get_profile("h100"),
        pci_bus_ids=(
            "00000000:9A:00.0",
            "00000000:18:00.0",
            "00000000:5D:00.0",
            "00000000:2A:00.0",
        ),
    )
    backend = SimBackend(profile, n_gpus=4, clock=VirtualClock())
    yield backend
    backend.close()


def uuid(b: SimBackend, i: int) -> str:
    return b.device_info(i).uuid


def test_all_and_none_select_every_gpu_in_nvml_order(sim: SimBackend) -> None:
    assert select_gpus(sim) == [0, 1, 2, 3]
    assert select_gpus(sim, "all") == [0, 1, 2, 3]
    assert select_gpus(sim, "ALL") == [0, 1, 2, 3]


def test_indices_lists_and_repeats(sim: SimBackend) -> None:
    assert select_gpus(sim, 2) == [2]
    assert select_gpus(sim, "3,1") == [3, 1]
    assert select_gpus(sim, " 1 , 1,0 ") == [1, 0]
    assert select_gpus(sim, [0, "2,3"]) == [0, 2, 3]


def test_index_out_of_range_names_the_valid_ones(sim: SimBackend) -> None:
    with pytest.raises(DeviceNotFound) as info:
        select_gpus(sim, "7")
    text = str(info.value)
    assert "'7'" in text and "0-3" in text
    assert "\n" not in text


def test_unknown_selector_says_what_forms_exist(sim: SimBackend) -> None:
    with pytest.raises(DeviceNotFound, match="cuda:N"):
        select_gpus(sim, "gpu zero")
    with pytest.raises(ConfigError, match="empty"):
        select_gpus(sim, " , ")


def test_uuid_full_prefix_and_case(sim: SimBackend) -> None:
    u2 = uuid(sim, 2)
    assert select_gpus(sim, u2) == [2]
    assert select_gpus(sim, u2.upper().replace("GPU-", "gpu-")) == [2]
    # the shortest prefix that is unique among the four
    for n in range(5, len(u2)):
        if sum(uuid(sim, i).startswith(u2[:n]) for i in range(4)) == 1:
            assert select_gpus(sim, u2[:n]) == [2]
            break


def test_ambiguous_uuid_prefix_is_an_error(sim: SimBackend) -> None:
    with pytest.raises(ConfigError, match="matches 4 GPUs"):
        select_gpus(sim, "GPU-")


def test_unknown_uuid_is_not_found(sim: SimBackend) -> None:
    with pytest.raises(DeviceNotFound):
        select_gpus(sim, "GPU-00000000-0000-0000-0000-000000000000")


def test_pci_bus_id_in_nvml_and_lspci_spelling(sim: SimBackend) -> None:
    bus = sim.device_info(3).pci_bus_id  # 00000000:5D:00.0
    assert select_gpus(sim, bus) == [3]
    assert select_gpus(sim, bus.lower()) == [3]
    short = bus.split(":", 1)[1]  # 5D:00.0, as lspci prints it
    assert select_gpus(sim, short) == [3]
    assert select_gpus(sim, "0000:" + short) == [3]
    with pytest.raises(DeviceNotFound):
        select_gpus(sim, "00000000:01:00.0")


def test_cuda_index_without_cuda_visible_devices_follows_pci_order(shuffled: SimBackend) -> None:
    env: dict[str, str] = {}
    # PCI order: 18 (NVML 1), 2A (NVML 3), 5D (NVML 2), 9A (NVML 0)
    assert cuda_visible(shuffled, env=env) == [1, 3, 2, 0]
    assert select_gpus(shuffled, "cuda:0", env=env) == [1]
    assert select_gpus(shuffled, "cuda:3", env=env) == [0]


def test_cuda_visible_devices_indices_renumber(shuffled: SimBackend) -> None:
    env = {"CUDA_VISIBLE_DEVICES": "2,0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    # CUDA 2 is bus 5D (NVML 2); CUDA 0 is bus 18 (NVML 1)
    assert select_gpus(shuffled, "cuda:0", env=env) == [2]
    assert select_gpus(shuffled, "cuda:1", env=env) == [1]
    with pytest.raises(DeviceNotFound) as info:
        select_gpus(shuffled, "cuda:2", env=env)
    text = str(info.value)
    assert "CUDA sees 2 GPUs" in text and "CUDA_VISIBLE_DEVICES='2,0'" in text
    assert "cuda:0, cuda:1" in text


def test_cuda_visible_devices_uuids_map_through_uuid(sim: SimBackend) -> None:
    env = {"CUDA_VISIBLE_DEVICES": f"{uuid(sim, 3)},{uuid(sim, 1)[:12]}"}
    assert cuda_visible(sim, env=env) == [3, 1]
    assert select_gpus(sim, "cuda:1", env=env) == [1]


def test_cuda_visible_devices_stops_at_the_first_invalid_entry(sim: SimBackend) -> None:
    assert cuda_visible(sim, env={"CUDA_VISIBLE_DEVICES": "1,7,2"}) == [1]
    assert cuda_visible(sim, env={"CUDA_VISIBLE_DEVICES": "0,-1,2"}) == [0]
    assert cuda_visible(sim, env={"CUDA_VISIBLE_DEVICES": "2,bogus,3"}) == [2]
    # CUDA does not mix indices with UUIDs: the list ends where the style changes
    assert cuda_visible(sim, env={"CUDA_VISIBLE_DEVICES": f"1,{uuid(sim, 2)}"}) == [1]


def test_cuda_visible_devices_empty_or_duplicate_hides_every_gpu(sim: SimBackend) -> None:
    for value in ("", "1,1", "NoDevFiles"):
        env = {"CUDA_VISIBLE_DEVICES": value}
        assert cuda_visible(sim, env=env) == []
        with pytest.raises(DeviceNotFound, match="CUDA sees 0 GPUs"):
            select_gpus(sim, "cuda:0", env=env)


def test_mig_device_means_its_parent_gpu_and_only_one_shows(sim: SimBackend) -> None:
    env = {"CUDA_VISIBLE_DEVICES": f"MIG-{uuid(sim, 2)}/1/0,MIG-{uuid(sim, 0)}/2/0"}
    assert cuda_visible(sim, env=env) == [2]
    assert select_gpus(sim, f"MIG-{uuid(sim, 1)}/7/0") == [1]
    with pytest.raises(DeviceNotFound):
        select_gpus(sim, "MIG-5e1a2b3c-0000-0000-0000-000000000000")  # a MIG UUID the sim lacks


def test_local_reads_local_rank_as_a_cuda_index(shuffled: SimBackend) -> None:
    env = {"LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "3,1"}
    # CUDA 3 is bus 9A (NVML 0), CUDA 1 is bus 2A (NVML 3): local rank 1 -> NVML 3
    assert select_gpus(shuffled, "local", env=env) == [3]


def test_local_without_local_rank_says_how(sim: SimBackend) -> None:
    with pytest.raises(ConfigError, match="LOCAL_RANK") as info:
        select_gpus(sim, "local", env={})
    assert "torchrun" in str(info.value)
    with pytest.raises(ConfigError, match="not a CUDA index"):
        select_gpus(sim, "local", env={"LOCAL_RANK": "x"})
    with pytest.raises(ConfigError, match="not a CUDA index"):
        select_gpus(sim, "cuda:one", env={})


def test_selection_does_not_touch_nvitop_or_torch_for_the_sim(sim: SimBackend) -> None:
    import sys

    before = {m for m in sys.modules if m.startswith(("nvitop", "torch"))}
    select_gpus(sim, "cuda:0", env={"CUDA_VISIBLE_DEVICES": "1"})
    after = {m for m in sys.modules if m.startswith(("nvitop", "torch"))}
    assert after == before


def test_cuda_order_is_parsed_without_asking_cuda(sim: SimBackend, monkeypatch) -> None:
    """nvitop asks CUDA in a subprocess (a CUDA init, hundreds of ms before `gpuenv run`'s
    command starts): only GPUs of mixed models in CUDA's default order need it."""
    from gpuenv import devices

    asked: list[str] = []

    def from_nvitop(view: object) -> list[int]:
        asked.append("nvitop")
        return [1]

    monkeypatch.setattr(devices._CudaView, "_from_nvitop", from_nvitop)
    assert select_gpus(sim, "cuda:0", env={"CUDA_VISIBLE_DEVICES": "1"}) == [1]
    assert select_gpus(sim, "local", env={"LOCAL_RANK": "1"}) == [1]
    assert asked == []

    def mixed(view: object) -> list[int]:
        raise ConfigError("cannot tell CUDA's order of these mixed GPU models without CUDA")

    monkeypatch.setattr(devices._CudaView, "_base_order", mixed)
    assert select_gpus(sim, "cuda:0", env={"CUDA_VISIBLE_DEVICES": "0"}) == [1]
    assert asked == ["nvitop"]


def test_describe(sim: SimBackend) -> None:
    assert describe(sim, 1) == "GPU 1 (NVIDIA H100 80GB HBM3)"
    assert describe(sim, 9) == "GPU 9"


# -- the real GPU (device only) -----------------------------------------------------------


@pytest.mark.gpu
def test_gpu_cuda_index_maps_through_uuid_on_the_real_gpu() -> None:
    from gpuenv.backend.nvml import NvmlBackend

    real = NvmlBackend()
    try:
        last = real.device_count() - 1
        env = {"CUDA_VISIBLE_DEVICES": real.device_info(last).uuid}
        assert select_gpus(real, "cuda:0", env=env) == [last]
        assert select_gpus(real, "local", env={**env, "LOCAL_RANK": "0"}) == [last]
        with pytest.raises(DeviceNotFound, match="CUDA sees 1 GPU"):
            select_gpus(real, "cuda:1", env=env)
        assert sorted(cuda_visible(real, env={})) == list(range(real.device_count()))
    finally:
        real.close()


@pytest.mark.gpu
def test_gpu_nvitop_answers_where_it_is_installed() -> None:
    """On real GPUs the CUDA side comes from nvitop (it asks CUDA); check it really answers."""
    pytest.importorskip("nvitop")
    from gpuenv.backend.nvml import NvmlBackend
    from gpuenv.devices import _CudaView

    real = NvmlBackend()
    try:
        uuid0 = real.device_info(0).uuid
        view = _CudaView(real, {"CUDA_VISIBLE_DEVICES": uuid0})
        assert view._from_nvitop() == [0]
    finally:
        real.close()


# -- this process's own GPUs: the one rule every door takes when none are named -------------


def test_own_gpus_in_order_local_rank_cuda_visible_devices_slurm_else_all(sim: SimBackend) -> None:
    assert own_gpus(sim, {}) == (
        [0, 1, 2, 3],
        "no CUDA_VISIBLE_DEVICES, LOCAL_RANK or Slurm GPUs: every GPU -> GPU 0, 1, 2, 3",
    )
    assert own_gpus(sim, {"CUDA_VISIBLE_DEVICES": "1"}) == (
        [1],
        "CUDA_VISIBLE_DEVICES=1 -> GPU 1",
    )
    assert own_gpus(sim, {"LOCAL_RANK": "1"}) == ([1], "LOCAL_RANK=1 -> GPU 1")
    # a rank takes its own CUDA device, not the whole visible set (its neighbour's GPU)
    ranked = own_gpus(sim, {"LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "2,3"})
    assert ranked == ([3], "LOCAL_RANK=1 under CUDA_VISIBLE_DEVICES=2,3 -> GPU 3")
    # Slurm's GPUs count only where CUDA_VISIBLE_DEVICES is not set; the step's first
    assert own_gpus(sim, {"SLURM_JOB_GPUS": "0,2"}) == ([0, 2], "SLURM_JOB_GPUS=0,2 -> GPU 0, 2")
    step = {"SLURM_JOB_GPUS": "0,2", "SLURM_STEP_GPUS": "2"}
    assert own_gpus(sim, step) == ([2], "SLURM_STEP_GPUS=2 -> GPU 2")
    assert own_gpus(sim, {**step, "CUDA_VISIBLE_DEVICES": "1"}).indices == [1]
    # a task of several Slurm tasks that all see two GPUs: the one at its local id
    task = {"SLURM_LOCALID": "1", "CUDA_VISIBLE_DEVICES": "0,1"}
    assert own_gpus(sim, task) == ([1], "SLURM_LOCALID=1 under CUDA_VISIBLE_DEVICES=0,1 -> GPU 1")


def test_own_gpus_follow_uuids_and_mig_devices_as_cuda_does(sim: SimBackend) -> None:
    env = {"CUDA_VISIBLE_DEVICES": f"{uuid(sim, 3)},{uuid(sim, 1)}"}
    assert own_gpus(sim, env).indices == [3, 1]
    assert own_gpus(sim, {"CUDA_VISIBLE_DEVICES": f"MIG-{uuid(sim, 2)}/1/0"}).indices == [2]


def test_own_gpus_that_name_no_gpu_here_are_an_error_not_every_gpu(sim: SimBackend) -> None:
    with pytest.raises(DeviceNotFound, match="CUDA_VISIBLE_DEVICES=''"):
        own_gpus(sim, {"CUDA_VISIBLE_DEVICES": ""})
    with pytest.raises(DeviceNotFound):
        own_gpus(sim, {"SLURM_STEP_GPUS": "7"})
    with pytest.raises(ConfigError, match="not a CUDA index"):
        own_gpus(sim, {"LOCAL_RANK": "x"})


def test_choose_gpus_names_an_explicit_selector_in_its_why(sim: SimBackend) -> None:
    env = {"CUDA_VISIBLE_DEVICES": "1"}
    assert choose_gpus(sim, None, env=env) == ([1], "CUDA_VISIBLE_DEVICES=1 -> GPU 1")
    assert choose_gpus(sim, "all", env=env) == ([0, 1, 2, 3], "gpus='all' -> GPU 0, 1, 2, 3")
    assert choose_gpus(sim, [2, 0], env=env, named="-i") == ([2, 0], "-i 2,0 -> GPU 2, 0")
