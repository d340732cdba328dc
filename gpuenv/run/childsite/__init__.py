"""The directory `gpuenv run` puts first on a Python command's PYTHONPATH: its
sitecustomize.py installs the import hook of gpuenv/run/autoregions.py. Nothing
else here is importable by the command (this file is never imported by it)."""
