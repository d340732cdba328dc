"""The torch.utils.benchmark subclasses behind gpuenv.integrations.torch_benchmark.

Importing this module imports torch: gpuenv.integrations.torch_benchmark loads it on
first use of `Timer`, `Measurement` or `Compare` (never at `import gpuenv`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

import torch.utils.benchmark as tb

from gpuenv.integrations.torch_record import (
    marked_description,
    merge_records,
    note,
    observe,
    task_name,
)


def _measured(run: Callable[[], Any], **kwargs: Any) -> Measurement:
    """torch's timing call observed and judged (one call, one measurement); its Measurement
    as gpuenv's, named by its label, sub_label and description (`Measurement.wrap`)."""
    measurement, rec = observe(run, **kwargs)
    return Measurement.wrap(measurement, rec)


@dataclasses.dataclass(init=True, repr=False)
class Measurement(tb.Measurement):
    """torch's Measurement whose `merge` keeps gpuenv's record (`metadata["gpuenv"]`, plain
    values, with its one-line "note"). A flagged call's description carries the verdict
    (`marked_description`), which torch's own Compare shows; pickled, it is torch's own
    Measurement, so it loads where gpuenv is not installed."""

    @classmethod
    def wrap(cls, measurement: Any, record: dict[str, Any] | None) -> Measurement:
        """`measurement` as this class, with `record` as its `metadata["gpuenv"]`, named by
        its task and, flagged, marked in its description."""
        meta = dict(measurement.metadata or {})
        task = measurement.task_spec
        if record is not None:
            record = {**record, "name": task_name(task)}
            meta["gpuenv"] = record
            task = dataclasses.replace(
                task, description=marked_description(task.description, record)
            )
        return cls(
            number_per_run=measurement.number_per_run,
            raw_times=list(measurement.raw_times),
            task_spec=task,
            metadata=meta or None,
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # torch's class: the pickle needs torch alone, and the record is plain values
        return (
            tb.Measurement,
            (self.number_per_run, list(self.raw_times), self.task_spec, self.metadata),
        )

    @staticmethod
    def merge(measurements: Iterable[tb.Measurement]) -> list[tb.Measurement]:
        """torch's merge (replicates of one task: times pooled, per run), keeping gpuenv's
        records merged (`merge_records`); other metadata is dropped, as torch drops it."""
        items = list(measurements)
        records: dict[Any, list[dict[str, Any]]] = {}
        for m in items:
            rec = (m.metadata or {}).get("gpuenv")
            if rec is not None:
                records.setdefault(m.task_spec, []).append(rec)
        out: list[tb.Measurement] = []
        for merged in tb.Measurement.merge(items):
            recs = records.get(merged.task_spec)
            out.append(Measurement.wrap(merged, merge_records(recs) if recs else None))
        return out


class Timer(tb.Timer):
    """torch.utils.benchmark.Timer whose measurements carry gpuenv's telemetry and verdict.

    Same arguments as torch's Timer, plus `gpuenv_session` (a `gpuenv.stable()` session:
    its sampler, facts and policy) and `gpuenv_gpus` (which GPUs to sample, default all).
    """

    def __init__(
        self, *args: Any, gpuenv_session: Any = None, gpuenv_gpus: Any = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self._gpuenv = {"session": gpuenv_session, "gpus": gpuenv_gpus}

    def timeit(self, number: int = 1000000) -> Measurement:
        return _measured(lambda: super(Timer, self).timeit(number), **self._gpuenv)

    def blocked_autorange(
        self, callback: Callable[[int, float], Any] | None = None, min_run_time: float = 0.2
    ) -> Measurement:
        return _measured(
            lambda: super(Timer, self).blocked_autorange(
                callback=callback, min_run_time=min_run_time
            ),
            **self._gpuenv,
        )

    def adaptive_autorange(
        self,
        threshold: float = 0.1,
        *,
        min_run_time: float = 0.01,
        max_run_time: float = 10.0,
        callback: Callable[[int, float], Any] | None = None,
    ) -> Measurement:
        return _measured(
            lambda: super(Timer, self).adaptive_autorange(
                threshold=threshold,
                min_run_time=min_run_time,
                max_run_time=max_run_time,
                callback=callback,
            ),
            **self._gpuenv,
        )


class Compare(tb.Compare):
    """torch's Compare, merged with `Measurement.merge` (so gpuenv's records survive), with
    a note under each table: every cell's verdict, findings and telemetry summary."""

    def _render(self) -> list[str]:
        tables = []
        by_label: dict[Any, list[tb.Measurement]] = {}
        for m in Measurement.merge(self._results):
            by_label.setdefault(m.label, []).append(m)
        for results in by_label.values():
            lines = [f"gpuenv (verdict: telemetry) of each {results[0].label or 'row'} cell:"]
            for m in results:
                cell = " / ".join(str(x) for x in (m.as_row_name, m.description) if x)
                lines.append(f"  {cell}: {note((m.metadata or {}).get('gpuenv'))}")
            tables.append(self._layout(results) + "\n".join(lines) + "\n")
        return tables


__all__ = ["Compare", "Measurement", "Timer"]
