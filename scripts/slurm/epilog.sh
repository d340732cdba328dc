#!/bin/bash
# gpuenv Slurm Epilog: put back the GPU clocks prolog.sh locked for this job.
#
#   slurm.conf:  Epilog=/etc/slurm/gpuenv-epilog.sh
#
# Runs as root on the compute node after the job. 'gpuenv restore' puts back
# exactly the state journaled before the prolog's lock. If that fails the
# epilog exits 1, which makes Slurm take the node out of service: a node whose
# clocks are in an unknown state should not run the next job (an admin runs
# 'gpuenv restore --all' and resumes it). Jobs that did not ask cost nothing.

set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
GPUENV=${GPUENV:-gpuenv}
STATE=${GPUENV_SLURM_STATE:-/run/gpuenv/slurm}
JOB=${SLURM_JOB_ID:?epilog.sh runs under slurmd, which sets SLURM_JOB_ID}
record="$STATE/job-$JOB.gpus"

[ -f "$record" ] || exit 0  # the prolog locked nothing for this job
gpus=$(cat "$record")
log() { logger -t gpuenv-slurm -- "job $JOB: $*" 2>/dev/null || true; echo "gpuenv-slurm: job $JOB: $*" >&2; }

if out=$("$GPUENV" restore -i "$gpus" 2>&1); then
    rm -f "$record"
    log "restored GPUs $gpus: $(printf '%s' "$out" | tr '\n' ' ')"
    exit 0
fi
log "could not restore GPUs $gpus: $(printf '%s' "$out" | tr '\n' ' ')"
exit 1
