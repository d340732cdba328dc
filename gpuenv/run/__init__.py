"""`gpuenv run -- <cmd>` and the regions a command marks.

    region.py    the child's side: gpuenv.region("name") writes each edge to the pipe
    tracker.py   the parent's side: read and pair edges into regions, window them
    runner.py    spawn the command, forward signals, lock, sample, restore
    report.py    a Measurement per region (judged by gpuenv.judge), the summary table

Nothing is imported here: a program marking regions imports only region.py.
"""
