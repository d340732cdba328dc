"""For tests of what gpuenv does on a machine without an NVIDIA driver (CI's machine)."""

from __future__ import annotations

import ctypes

import pytest


def nvml_loadable() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


# a test of the machine without a driver: skipped where one is installed
without_driver = pytest.mark.skipif(nvml_loadable(), reason="this machine has an NVIDIA driver")
