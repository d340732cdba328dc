"""gpuenv.judge: the one judge every door to a measurement goes through."""

from __future__ import annotations

import pytest

from gpuenv.errors import ConfigError
from gpuenv.judge import apply_policy, retry_delays
from gpuenv.verdict import Finding, MeasurementRejected, VerdictConfig

# -- policies -------------------------------------------------------------------------------


def finding(kind: str, severity: str, reps: tuple[int, ...]) -> Finding:
    return Finding(kind, severity, reps, "x")


def test_annotate_keeps_everything():
    r = apply_policy([finding("power_cap", "info", (0,))], 5, "annotate")
    assert (r.verdict, r.rejected_reps) == ("annotated", ())
    assert apply_policy([], 5, "annotate").verdict == "ok"


def test_reject_drops_reps_with_warnings_but_not_info():
    found = [finding("warmup_ramp", "warning", (0, 1)), finding("power_cap", "info", (2, 3))]
    r = apply_policy(found, 10, "reject")
    assert r.rejected_reps == (0, 1)
    assert r.verdict == "annotated"


def test_reject_raises_a_clear_error_when_too_few_reps_remain():
    found = [finding("other_process", "warning", tuple(range(9)))]
    with pytest.raises(MeasurementRejected, match="only 1 of 10 reps of 'gemm'") as err:
        apply_policy(found, 10, "reject", name="gemm")
    assert "policy='annotate'" in str(err.value)
    r = apply_policy(found, 10, "reject", raise_if_too_few=False)
    assert r.verdict == "rejected"


def test_a_single_rejected_region_gets_a_verdict_not_an_exception():
    r = apply_policy([finding("lock_not_held", "warning", (0,))], 1, "reject")
    assert r.verdict == "rejected" and r.rejected_reps == (0,)


def test_unknown_policy_is_refused():
    with pytest.raises(ConfigError, match="unknown policy"):
        apply_policy([], 1, "ignore")


def test_retry_delays_back_off_up_to_a_cap():
    c = VerdictConfig(retry_delay_s=1.0, retry_backoff=3.0, retry_max_delay_s=5.0, max_retries=4)
    assert retry_delays(c) == [1.0, 3.0, 5.0, 5.0]
    assert retry_delays(VerdictConfig(max_retries=0)) == []


def test_facts_are_read_in_one_place_with_the_max_operating_temperature(sim):
    """bench() once read its own facts without gpu_max_c: "near the thermal limit" was
    judged against the 89 C slowdown threshold while stable() used the 87 C max."""
    from gpuenv.judge import read_facts
    from gpuenv.timing.harness import _facts

    (facts,) = read_facts(sim, [0]).values()
    assert (facts.max_sm_mhz, facts.slowdown_c, facts.gpu_max_c) == (1980, 89, 87)
    assert _facts(None, sim, 0)[0][0] == facts  # bench without a session: the same facts
