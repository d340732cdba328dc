"""Moved to benchmarks/checkout.py; this name stays for the scripts still here that
import it as `from checkout import ...` (run as files, with scripts/ on sys.path)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.checkout import ENTRY, GPUENV, ROOT, checkout_env

__all__ = ["ENTRY", "GPUENV", "ROOT", "checkout_env"]
