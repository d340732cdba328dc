"""Profiles of the simulated GPU: data, one frozen record per kind of card.

A profile holds what NVML would report (names, clock lists, limits,
thresholds) and the constants of the physics in `sim.py`:

    power_w  = p_base_w + leakage(T) + (f / f_max) ** dyn_exponent * (p_clock_w + load * p_load_w)
    leakage  = max(0, leak_ref_w + leak_w_per_c * (T - leak_ref_c))
    dT/dt    = (ambient_c + r_c_per_w * power_w - T) / tau_s

Leakage is linear in temperature: an exponential fitted to the same two points
grows so steeply that any chip past ~80 C runs away thermally (d leakage / dT
times R above 1), which real GPUs with working cooling do not do.

The "h100" numbers are fitted to an H100 measured read-only
(docs/explanation/what-gpus-do.md; idle 72 W at 36 C, 120 W with a context, 700 W cap
reached at ~1515 MHz when cool and ~1380 MHz at 63 C, 36 -> 63 C over 45 s of sustained
load); `benchmarks/sim_fidelity.py`
checks them. The "h200" is fitted to the H200s measured the same way (same page).
The "a100", "l40s" and "b200" take what nvidia-smi and CUDA report on those GPUs from
public outputs and spec sheets, and physics that are estimates (each says which of its
figures are); docs/how-to/simulated-gpu.md tabulates every model's figures and sources.
"rtx4090" and "legacy" are plausible, not measured: a consumer card with weak cooling
that reaches thermal slowdown, and a pre-Volta data-centre card that has application
clocks but no locked clocks.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


def clock_range(low: float, high: float, step: float) -> tuple[int, ...]:
    """Supported clocks from `high` down to `low` in `step` MHz (rounded: 7.5 -> 7/8 steps)."""
    n = round((high - low) / step)
    return tuple(round(high - i * step) for i in range(n + 1))


@dataclass(frozen=True)
class SimProfile:
    key: str  # "h100"
    gpu_name: str  # what nvmlDeviceGetName returns
    compute_capability: tuple[int, int] | None
    memory_total_mib: int
    driver_version: str
    sm_clocks_mhz: tuple[
        int, ...
    ]  # supported graphics clocks, descending (the same for every memory clock)
    mem_clocks_mhz: tuple[int, ...]  # supported memory clocks, descending
    idle_sm_mhz: int  # no CUDA context: the GPU parks here with reason GpuIdle
    base_sm_mhz: int | None  # TDP/base clock: what (CLOCK_LIMIT_TDP, CLOCK_LIMIT_TDP) locks to
    default_app_sm_mhz: int
    default_app_mem_mhz: int
    locked_clocks_supported: bool  # nvmlDeviceSetGpuLockedClocks (Volta+)
    locked_mem_supported: bool  # nvmlDeviceSetMemoryLockedClocks taking effect at once (not Hopper)
    app_clocks_supported: bool  # nvmlDeviceSetApplicationsClocks (not on GeForce)
    mig_capable: bool
    power_default_w: float
    power_min_w: float
    power_max_w: float
    # -- power model (see module docstring) --
    p_base_w: float
    leak_ref_w: float
    leak_ref_c: float
    leak_w_per_c: float  # leakage grows this much per degree
    p_clock_w: float
    p_load_w: float
    dyn_exponent: float
    # -- thermal model --
    ambient_c: float
    r_c_per_w: float
    tau_s: float
    # -- thresholds (nvidia-smi -q -d TEMPERATURE); None where the card does not report one --
    slowdown_c: float  # HW thermal slowdown (reasons 0x40 | 0x8)
    shutdown_c: float  # the GPU shuts down: the sim reports it lost
    gpu_max_c: float | None  # max operating temperature: the SW thermal slowdown target (0x20)
    mem_max_c: float | None
    mem_temp_offset_c: float | None  # memory runs this much hotter; None: no memory sensor
    supported_reasons: int
    persistence_default: bool
    pci_bus_ids: tuple[str, ...]  # for GPUs 0.. in NVML order; more are generated
    context_mib: int = 512  # device memory a CUDA context takes
    uuid_prefix: str = "GPU"
    # -- driver timing --
    update_s: float = 0.1  # clocks, power, reasons and counters refresh this often
    temp_update_s: float = 0.2
    power_filter_s: float = 0.15  # time constant of the power the cap controller acts on
    max_step_down: int = 8  # clock steps the cap may drop per update period
    # after the power falls under the limit the cap keeps the clock one step under its
    # target (and its reason set) this long: an H100 after 1 s of 8192^3 matmuls read
    # 1965 MHz from ~0.2 s and 1980 MHz, the reason cleared, at 0.50-0.59 s
    cap_hold_s: float = 0.5
    # A second, fast view of the power the cap acts on (a filter with this time constant,
    # looked at every physics step, 10 ms, not only at driver updates); None: none. An
    # H100 capped an MLP block (gelu(X @ W1) @ W2, 2.9 ms a call, 1.09-1.34x the limit)
    # inside 30-60 ms bursts begun from rest, 0.1-0.3 s apart
    # (benchmarks/results/dropin_mlp.json), which the 0.15 s filter cannot do; the
    # "h100-fastcap" profile has it, calibrated so that such a kernel (~1.29x) meets the
    # cap 40-50 ms into work from rest and not in 25 ms. "h100" keeps the 100-300 ms onset
    # measured with 8192^3 matmuls.
    cap_fast_filter_s: float | None = None
    hw_slowdown_factor: float = 0.5  # HW slowdown pulls the clock to this fraction of max
    # P-state with no context (nvidia-smi's pstate): an H100 kept persistent says P0 even
    # at its 345 MHz idle clock (nvidia-smi 590 on an H100 SXM); consumer cards drop to P8
    idle_pstate: int = 8
    # -- the board, as nvidia-smi -q shows it (GpuDetails); the h100's from an H100 SXM5 --
    pci_device_id: int = 0x233010DE  # device << 16 | NVIDIA's vendor id
    pci_sub_device_id: int = 0x16C110DE
    vbios_version: str = "96.00.DA.00.0C"
    pcie_gen: int = 5  # current = max once busy; an idle link drops to gen 1
    pcie_width: int = 16
    fan_pct: int | None = None  # None: cooled by the chassis (SXM), nvidia-smi says [N/A]
    ecc: bool = True
    row_remapping: bool = True  # Ampere+ data-centre parts remap rows instead of retiring pages
    reserved_mib: int = 480  # held by driver and firmware (memory.reserved; an H100 SXM's)
    display: bool = False
    video_mhz: tuple[int, int] = (765, 1755)  # video clock idle, busy
    inforom: tuple[str | None, ...] = ("G520.0200.00.05", "2.1", "7.16", None)  # img, oem, ecc, pwr
    # -- the memory system, as CUDA reports it (cudaDeviceProp); the h100's from an H100 SXM --
    l2_bytes: int = 50 << 20  # torch.cuda.get_device_properties().L2_cache_size
    # memoryBusWidth: the peak bandwidth is bus / 8 * 2 (double data rate) * memory clock
    # (an H100 SXM: 5120 bits at 2619 MHz, 3.35 TB/s, NVIDIA's figure)
    mem_bus_bits: int = 5120

    @property
    def max_sm_mhz(self) -> int:
        return self.sm_clocks_mhz[0]

    @property
    def max_mem_mhz(self) -> int:
        return self.mem_clocks_mhz[0]

    @property
    def mem_bandwidth_gbs(self) -> float:
        """Peak memory bandwidth at the top memory clock, GB/s (what a spec sheet says)."""
        return self.mem_bus_bits / 8 * 2 * self.max_mem_mhz / 1000

    @property
    def sw_thermal_c(self) -> float:
        """Temperature above which the driver lowers clocks (SwThermalSlowdown)."""
        return self.gpu_max_c if self.gpu_max_c is not None else self.slowdown_c - 2.0


_SXM_BUSES = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")

H100 = SimProfile(
    key="h100",
    gpu_name="NVIDIA H100 80GB HBM3",
    compute_capability=(9, 0),
    memory_total_mib=81559,
    driver_version="580.159.04",
    sm_clocks_mhz=clock_range(345, 1980, 15),
    mem_clocks_mhz=(2619, 1593),
    idle_sm_mhz=345,
    base_sm_mhz=1590,
    default_app_sm_mhz=1980,
    default_app_mem_mhz=2619,
    locked_clocks_supported=True,
    locked_mem_supported=False,  # Hopper: only the deferred -lmcd works (what-gpus-do.md)
    app_clocks_supported=True,
    mig_capable=True,
    power_default_w=700.0,
    power_min_w=200.0,
    power_max_w=700.0,
    p_base_w=30.0,
    leak_ref_w=40.0,
    leak_ref_c=36.0,
    leak_w_per_c=4.873,
    p_clock_w=50.0,
    p_load_w=976.0,
    dyn_exponent=2.0,
    ambient_c=32.33,
    r_c_per_w=0.05096,
    tau_s=24.0,
    slowdown_c=89.0,
    shutdown_c=95.0,
    gpu_max_c=87.0,
    mem_max_c=95.0,
    mem_temp_offset_c=3.0,
    supported_reasons=0x1FF,
    persistence_default=True,
    pci_bus_ids=tuple(f"00000000:{b}:00.0" for b in _SXM_BUSES),
    idle_pstate=0,
)

RTX4090 = SimProfile(
    key="rtx4090",
    gpu_name="NVIDIA GeForce RTX 4090",
    compute_capability=(8, 9),
    memory_total_mib=24564,
    driver_version="580.159.04",
    sm_clocks_mhz=clock_range(210, 2790, 15),
    mem_clocks_mhz=(10501, 5001, 810, 405),
    idle_sm_mhz=210,
    base_sm_mhz=2235,
    default_app_sm_mhz=2790,
    default_app_mem_mhz=10501,
    locked_clocks_supported=True,
    locked_mem_supported=True,
    app_clocks_supported=False,  # GeForce: nvmlDeviceSetApplicationsClocks is NOT_SUPPORTED
    mig_capable=False,
    power_default_w=450.0,
    power_min_w=150.0,
    power_max_w=600.0,
    p_base_w=12.0,
    leak_ref_w=10.0,
    leak_ref_c=35.0,
    leak_w_per_c=0.5,
    p_clock_w=25.0,
    p_load_w=470.0,
    dyn_exponent=2.2,
    # A tower case with a clogged filter: 450 W would settle near 95 C, so a
    # sustained load meets SW thermal slowdown at 83 C within a minute or two.
    ambient_c=30.0,
    r_c_per_w=0.145,
    tau_s=40.0,
    slowdown_c=88.0,
    shutdown_c=92.0,
    gpu_max_c=83.0,
    mem_max_c=None,
    mem_temp_offset_c=None,
    supported_reasons=0x1FF,
    persistence_default=False,
    pci_bus_ids=("00000000:01:00.0", "00000000:02:00.0", "00000000:41:00.0", "00000000:42:00.0"),
    context_mib=400,
    pci_device_id=0x268410DE,
    pci_sub_device_id=0x167010DE,
    vbios_version="95.02.18.80.5F",
    pcie_gen=4,
    fan_pct=30,
    ecc=False,
    row_remapping=False,
    reserved_mib=353,
    display=True,
    video_mhz=(1185, 2415),
    l2_bytes=72 << 20,
    mem_bus_bits=384,  # GDDR6X: 1008 GB/s at 10501 MHz
)

LEGACY = SimProfile(
    key="legacy",
    gpu_name="Tesla P100-PCIE-16GB",
    compute_capability=(6, 0),
    memory_total_mib=16280,
    driver_version="535.247.01",
    sm_clocks_mhz=clock_range(544, 1328, (1328 - 544) / 62),  # ~12.6 MHz steps, as on a P100
    mem_clocks_mhz=(715,),
    idle_sm_mhz=544,
    base_sm_mhz=1189,
    default_app_sm_mhz=1328,  # a real P100 says 1189 but boosts past it; the sim has no autoboost
    default_app_mem_mhz=715,
    locked_clocks_supported=False,  # pre-Volta: application clocks only
    locked_mem_supported=False,
    app_clocks_supported=True,
    mig_capable=False,
    power_default_w=250.0,
    power_min_w=125.0,
    power_max_w=250.0,
    p_base_w=18.0,
    leak_ref_w=8.0,
    leak_ref_c=30.0,
    leak_w_per_c=0.3,
    p_clock_w=10.0,
    p_load_w=235.0,
    dyn_exponent=2.0,
    ambient_c=25.0,
    r_c_per_w=0.16,
    tau_s=30.0,
    slowdown_c=88.0,
    shutdown_c=93.0,
    gpu_max_c=None,  # not reported by pre-Volta cards
    mem_max_c=None,
    mem_temp_offset_c=None,
    supported_reasons=0x1FF,
    persistence_default=True,
    pci_bus_ids=("00000000:04:00.0", "00000000:06:00.0", "00000000:07:00.0", "00000000:08:00.0"),
    context_mib=300,
    pci_device_id=0x15F810DE,
    pci_sub_device_id=0x118F10DE,
    vbios_version="86.00.26.00.02",
    pcie_gen=3,
    row_remapping=False,
    reserved_mib=0,
    video_mhz=(544, 1328),
    l2_bytes=4 << 20,
    mem_bus_bits=4096,  # HBM2: 732 GB/s at 715 MHz
)

# -- data-centre GPUs users measure on (issue 42). Sources, per figure, in
# docs/how-to/simulated-gpu.md's table: "measured" is the project's own read-only
# measurement (docs/explanation/what-gpus-do.md), "public" an nvidia-smi / CUDA output or spec sheet
# quoted in a public issue or NVIDIA's datasheet, "est." an estimate that a device run
# (tests/test_nvml.py's gpu test on that GPU) should confirm or correct.

# The H200 SXM 141GB: the H100's die (GH100, 132 SMs) with HBM3e. Measured read-only on
# the lent H200s (docs/explanation/what-gpus-do.md, 2026-11-27/28;
# benchmarks/results/power_lag.json):
# idle 345 MHz at 32-39 C and 77-81 W, 123-125 W with a context; max SM 1980, memory 3201,
# 700 W; under bf16 8192 matmuls the cap holds 1425-1455 MHz at 690-700 W, the chip at
# 54-57 C within 7 s, and 5 s after the load 1980 MHz again at ~35 C (it heats and cools
# far faster than the H100 measured, tau ~2 s against 24 s); the first SwPowerCap reading
# 127-178 ms into the load.
H200 = dataclasses.replace(
    H100,
    key="h200",
    gpu_name="NVIDIA H200",
    memory_total_mib=143771,  # public: nvidia-smi on an H200 SXM
    mem_clocks_mhz=(3201, 1593),  # 3201 measured; the second, 1593 as on the H100: est.
    base_sm_mhz=1590,  # est.: the H100's (same die, same 700 W); NVML has no getter
    default_app_mem_mhz=3201,
    # power: idle 79 W at 35 C, +46 W with a context (measured); the load term fitted so
    # that the cap holds ~1455 MHz cool and ~1440 MHz at 56 C (measured 1425-1455): a weak
    # leakage slope (1.4 W/C, the H100's 4.9) is what keeps the capped clock that flat
    p_base_w=30.0,
    leak_ref_w=47.0,
    leak_ref_c=35.0,
    leak_w_per_c=1.4,
    p_clock_w=46.0,
    p_load_w=1076.0,
    # thermal: +21 C at 700 W (35 -> 56 C) reached within 7 s, back near 35 C 5 s after
    ambient_c=31.0,
    r_c_per_w=0.0338,
    tau_s=1.5,
    # thresholds: slowdown 89 C measured; shutdown, max operating and memory max, the
    # supported reasons, the board's VBIOS and inforom, as the H100's (est.)
    pci_device_id=0x233510DE,  # public (pci.ids: GH100 [H200 SXM 141GB])
    l2_bytes=60 << 20,  # measured: PyTorch's L2_cache_size on the H200
    # six 1024-bit HBM3e stacks (public): 4.9 TB/s peak at 3201 MHz, NVIDIA says 4.8;
    # a device-to-device copy measured ~4.3 TB/s (read + write)
    mem_bus_bits=6144,
)

# The A100 SXM4 80GB, 400 W (Ampere, GA100, 108 SMs). Public: the name, 81920 MiB, SM
# clocks to 1410 MHz in 15 MHz steps, one memory clock (1593 MHz: 2039 GB/s over 5120
# bits), 400 / 100 / 400 W (an A100 SXM4's nvidia-smi -q, NVIDIA/nvidia-docker#1648), 40
# MiB of L2. The physics are est.: no A100 was measured here; a heavy GEMM is assumed to
# meet the 400 W cap just (~1.1x at 1410 MHz), holding ~1350 MHz cool and ~1290 MHz hot.
A100 = SimProfile(
    key="a100",
    gpu_name="NVIDIA A100-SXM4-80GB",
    compute_capability=(8, 0),
    memory_total_mib=81920,
    driver_version="580.159.04",
    sm_clocks_mhz=clock_range(210, 1410, 15),
    mem_clocks_mhz=(1593,),
    idle_sm_mhz=210,
    base_sm_mhz=1275,  # est. (spec sheets' base clock of the SXM4 80GB)
    # a real A100 reports a default application clock under its max (1095 MHz on the
    # 40GB SXM4, public; the 80GB's est. 1275) and boosts past it; the sim has no autoboost
    default_app_sm_mhz=1410,
    default_app_mem_mhz=1593,
    locked_clocks_supported=True,
    locked_mem_supported=True,  # Ampere: nvmlDeviceSetMemoryLockedClocks (one clock to lock)
    app_clocks_supported=True,
    mig_capable=True,
    power_default_w=400.0,
    power_min_w=100.0,
    power_max_w=400.0,
    # est.: idle ~50 W with no context, ~70 W with one
    p_base_w=25.0,
    leak_ref_w=25.0,
    leak_ref_c=32.0,
    leak_w_per_c=1.0,
    p_clock_w=20.0,
    p_load_w=359.0,
    dyn_exponent=2.0,
    # est.: an air-cooled HGX A100 settles near 64 C under 400 W
    ambient_c=30.0,
    r_c_per_w=0.085,
    tau_s=20.0,
    slowdown_c=89.0,  # est. (thresholds commonly reported for A100 SXM4)
    shutdown_c=92.0,
    gpu_max_c=85.0,
    mem_max_c=95.0,
    mem_temp_offset_c=3.0,
    supported_reasons=0x1FF,
    persistence_default=True,
    pci_bus_ids=tuple(
        f"00000000:{b}:00.0" for b in ("07", "0F", "47", "4E", "87", "90", "B7", "BD")
    ),
    idle_pstate=0,  # est.: a persistent data-centre card says P0 at idle, as the H100 does
    pci_device_id=0x20B210DE,  # public (pci.ids: GA100 [A100 SXM4 80GB])
    vbios_version="92.00.45.00.05",  # public: an A100-SXM4-80GB, NVIDIA/CUDALibrarySamples#104
    pcie_gen=4,
    video_mhz=(795, 1290),  # max 1290 public (A100 SXM4), idle est.
    l2_bytes=40 << 20,
    mem_bus_bits=5120,
)

# The L40S (Ada, AD102, 142 SMs): a passively cooled 350 W PCIe card in a server.
# Public: the name, 46068 MiB, boost 2520 MHz, GDDR6 at 9001 MHz (864 GB/s over 384 bits),
# 350 W, 96 MB of L2, PCIe gen 4 (NVIDIA's datasheet; nvidia-smi -q on an L40S,
# isaac-sim/IsaacSim#228). The rest is est.: the Ada memory P-states as the RTX 4090's,
# the thresholds, and the physics (a heavy GEMM at ~1.4x the limit at 2520 MHz, capped at
# ~2100 MHz cool and ~2010 MHz at 75 C; no thermal slowdown with the chassis' airflow).
L40S = SimProfile(
    key="l40s",
    gpu_name="NVIDIA L40S",
    compute_capability=(8, 9),
    memory_total_mib=46068,
    driver_version="580.159.04",
    sm_clocks_mhz=clock_range(210, 2520, 15),
    mem_clocks_mhz=(9001, 5001, 810, 405),
    idle_sm_mhz=210,
    base_sm_mhz=1110,  # est. (spec sheets' base clock)
    default_app_sm_mhz=2520,
    default_app_mem_mhz=9001,
    locked_clocks_supported=True,
    locked_mem_supported=True,
    app_clocks_supported=True,  # a data-centre card: application clocks, unlike GeForce
    mig_capable=False,
    power_default_w=350.0,
    power_min_w=100.0,  # est.
    power_max_w=350.0,
    p_base_w=15.0,
    leak_ref_w=18.0,
    leak_ref_c=30.0,
    leak_w_per_c=0.6,
    p_clock_w=50.0,
    p_load_w=419.0,
    dyn_exponent=2.2,
    ambient_c=30.0,
    r_c_per_w=0.125,
    tau_s=45.0,
    slowdown_c=92.0,  # est.
    shutdown_c=97.0,
    gpu_max_c=87.0,
    mem_max_c=None,  # est.: GDDR6, no memory sensor reported
    mem_temp_offset_c=None,
    supported_reasons=0x1FF,
    persistence_default=True,
    pci_bus_ids=("00000000:34:00.0", "00000000:35:00.0", "00000000:B4:00.0", "00000000:B5:00.0"),
    context_mib=400,
    pci_device_id=0x26B910DE,  # public: GPU part number 26B9 (nvidia-smi -q)
    vbios_version="95.02.66.00.15",  # public: isaac-sim/IsaacSim#228
    pcie_gen=4,
    video_mhz=(1185, 1965),  # est.
    l2_bytes=96 << 20,
    mem_bus_bits=384,
)

# The B200 (Blackwell, 148 SMs), 1000 W. Public: the name, 183359 MiB, 1000 W, idle 192-196 W
# at 33-35 C in P0 (nvidia-smi 580.95.05, NVIDIA/TensorRT-LLM#10278); memory 3996 MHz over
# 7680 bits (7.67 TB/s), 126.5 MiB of L2, compute capability 10.0 (pytorch/ao#4002);
# MIG (NVIDIA/mig-parted#166). Est.: the SM clocks (boost 1965 MHz, down to 120 MHz), the
# base clock, the minimum power limit, the thresholds, and the physics (a heavy GEMM at
# ~1.3x the limit at 1965 MHz, capped at ~1700 MHz cool and ~1655 MHz at 60 C).
B200 = SimProfile(
    key="b200",
    gpu_name="NVIDIA B200",
    compute_capability=(10, 0),
    memory_total_mib=183359,
    driver_version="580.159.04",
    sm_clocks_mhz=clock_range(120, 1965, 15),
    mem_clocks_mhz=(3996,),
    idle_sm_mhz=120,
    base_sm_mhz=1665,  # est.
    default_app_sm_mhz=1965,
    default_app_mem_mhz=3996,
    locked_clocks_supported=True,
    locked_mem_supported=False,  # est.: HBM, as on Hopper
    app_clocks_supported=True,
    mig_capable=True,
    power_default_w=1000.0,
    power_min_w=200.0,  # est.
    power_max_w=1000.0,
    p_base_w=60.0,
    leak_ref_w=80.0,
    leak_ref_c=33.0,
    leak_w_per_c=2.0,
    p_clock_w=55.0,
    p_load_w=1081.0,
    dyn_exponent=2.0,
    ambient_c=30.0,
    r_c_per_w=0.028,
    tau_s=10.0,
    slowdown_c=89.0,  # est.: as the H100's
    shutdown_c=95.0,
    gpu_max_c=87.0,
    mem_max_c=95.0,
    mem_temp_offset_c=3.0,
    supported_reasons=0x1FF,
    persistence_default=True,
    pci_bus_ids=tuple(
        f"00000000:{b}:00.0" for b in ("05", "06", "65", "66", "85", "86", "E5", "E6")
    ),
    idle_pstate=0,
    pci_device_id=0x290110DE,  # public (NVIDIA/gpu-operator#1242: device 2901)
    l2_bytes=int(126.5 * (1 << 20)),
    mem_bus_bits=7680,
)

# The H100 as it met the cap on a heavy MLP block (see SimProfile.cap_fast_filter_s)
H100_FASTCAP = dataclasses.replace(H100, key="h100-fastcap", cap_fast_filter_s=0.028)

PROFILES: dict[str, SimProfile] = {
    p.key: p for p in (H100, H100_FASTCAP, RTX4090, LEGACY, H200, A100, L40S, B200)
}


def get_profile(profile: str | SimProfile) -> SimProfile:
    """A profile by key ("h100", "h200", "a100", "l40s", "b200", "rtx4090", "legacy",
    "h100-fastcap"), or the record."""
    from gpuenv.errors import ConfigError

    if isinstance(profile, SimProfile):
        return profile
    key = str(profile).strip().lower()
    if key not in PROFILES:
        raise ConfigError(
            f"unknown simulated GPU profile {profile!r} (from GPUENV_SIM_PROFILE or the caller)",
            hint=f"use one of: {', '.join(PROFILES)}",
        )
    return PROFILES[key]


def profile_for_gpu(gpu_name: str) -> SimProfile | None:
    """The profile that models a GPU of this name (as `nvmlDeviceGetName` / nvidia-smi's
    `name` say it: "NVIDIA H200"), or None. A name's first profile is its plain one
    ("h100", not the "h100-fastcap" variant)."""
    return next((p for p in PROFILES.values() if p.gpu_name == gpu_name.strip()), None)


__all__ = [
    "A100",
    "B200",
    "H100",
    "H100_FASTCAP",
    "H200",
    "L40S",
    "LEGACY",
    "PROFILES",
    "RTX4090",
    "SimProfile",
    "clock_range",
    "get_profile",
    "profile_for_gpu",
]
