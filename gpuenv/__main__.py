"""`python -m gpuenv ...`: the same as the `gpuenv` command, for machines where the
package is on PYTHONPATH but its console script is not installed."""

from gpuenv.cli import main

main()
