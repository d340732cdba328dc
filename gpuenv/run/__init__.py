"""`gpuenv run -- <cmd>` and the regions a command marks.

    region.py    the child's side: gpuenv.region("name") writes each edge to the pipe
    tracker.py   the parent's side: read and pair edges into regions, window them
    plan.py      the options checked before anything runs, --dry-run, the exit
    runner.py    spawn the command, forward signals, lock, sample, restore
    report.py    a Measurement per region name and per automatic call (gpuenv.judge), the table
    perfgrid.py  a perf_report benchmark's table with each point's verdict (stderr, CSV)
    autoregions.py  each do_bench / torch Timer / pytest-benchmark call a measurement, unmodified
    childsite/   the sitecustomize on a Python command's path that installs that import hook
    nvtx.py      --regions nvtx: NVTX ranges as regions (nvtx_inject.c, built with cc)
    ranks.py     torchrun / Slurm: each rank's GPU and file, --summary rank0's one table

Nothing is imported here: a program marking regions imports only region.py.
"""
