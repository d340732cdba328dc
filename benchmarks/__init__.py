"""gpuenv's benchmark suite: one module per figure, run as `python -m benchmarks.<name>`.

Each writes its results as JSON under benchmarks/results/ (benchmarks/runner.py: the
shared arguments, the machine, date, commit and GPU recorded); `python -m benchmarks
report` regenerates the benchmark pages of the docs from them, and `python -m
benchmarks check NEW.json` fails on a regression against the kept results.
"""
