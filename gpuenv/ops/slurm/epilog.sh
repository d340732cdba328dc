#!/bin/bash
# gpuenv Slurm Epilog: put back the GPU clocks the prolog locked for this job.
#
#   install:     gpuenv ops install epilog   # /etc/slurm/gpuenv-epilog.sh
#   slurm.conf:  Epilog=/etc/slurm/gpuenv-epilog.sh
#
# Runs as root on the compute node after the job. 'gpuenv restore' puts back
# exactly the state journaled before the prolog's lock. It exits 0 too when there
# is nothing of gpuenv's to put back (an epilog run again, a GPU never locked): a
# GPU not at the driver's defaults then (a power limit the site set on purpose) is
# left as it is and named in the log. It fails (exit 2) only when it had a record
# and could not put it back: then the epilog exits 1, which makes Slurm take the
# node out of service: a node whose clocks are in an unknown state should not run
# the next job (an admin runs 'gpuenv restore --all' and resumes it). Jobs that did not ask are not touched; their
# report (gpuenvd's record of every GPU job) is closed like any other.

set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# the site's settings (slurmd gives prologs and epilogs only SLURM_*): root's file only
site=/etc/default/gpuenv-slurm
# shellcheck disable=SC1090
if [ -f "$site" ] && [ -O "$site" ]; then . "$site"; fi
GPUENV=${GPUENV:-gpuenv}
STATE=${GPUENV_SLURM_STATE:-/run/gpuenv/slurm}
JOB=${SLURM_JOB_ID:?the gpuenv epilog runs under slurmd, which sets SLURM_JOB_ID}
record="$STATE/job-$JOB.gpus"
log() {
    logger -t gpuenv-slurm -- "job $JOB: $*" 2>/dev/null || true
    echo "gpuenv-slurm: job $JOB: $*" >&2
    { mkdir -p "$STATE" && echo "$(date -u +%FT%TZ) job $JOB: $*" >> "$STATE/gpuenv-slurm.log"; } 2>/dev/null || true
}

# The job's report first (its telemetry ends with the job, before the restore), then its
# one-line verdict appended to report=PATH from its comment, else to its output file,
# written as the job's user (never as root into a path a user names).
if [ -n "${SLURM_JOB_GPUS-}" ] && [ "${GPUENV_SLURM_REPORT:-1}" = 1 ] &&
    verdict=$("$GPUENV" job "$JOB" --end 2>/dev/null); then
    log "$verdict"
    info=$(scontrol show job -o "$JOB" 2>/dev/null)
    comment=${SLURM_JOB_COMMENT-$(printf '%s' "$info" | sed -n 's/.* Comment=//p')}
    target=$(printf '%s' "$comment" | sed -n 's/.*gpuenv:[^ ]*report=\([A-Za-z0-9.\/_~+-]*\).*/\1/p')
    [ -n "$target" ] || target=$(printf '%s' "$info" | sed -n 's/.* StdOut=\([^ ]*\).*/\1/p')
    if [ -n "$target" ] && [ -n "${SLURM_JOB_UID-}" ]; then
        setpriv --reuid="$SLURM_JOB_UID" --regid="${SLURM_JOB_GID:-$SLURM_JOB_UID}" --clear-groups \
            -- sh -c 'printf "%s\n" "$1" >> "$2"' sh "$verdict" "$target" 2>/dev/null ||
            log "could not append the verdict to $target"
    fi
fi

# After the restore, the node's report where every node sees it (GPUENV_JOBS_DIR) and its
# one line in the job's AdminComment (`scontrol show job`): "yes", "no" or "none" restored.
publish() {
    [ -n "${SLURM_JOB_GPUS-}" ] && [ "${GPUENV_SLURM_REPORT:-1}" = 1 ] || return 0
    [ -n "${verdict-}" ] || return 0  # gpuenvd had no record of the job: nothing to share
    out=$("$GPUENV" job "$JOB" --publish --restored "$1" --jobs-dir "${GPUENV_JOBS_DIR-}" 2>&1) ||
        log "could not publish the job's report: $(printf '%s' "$out" | tr '\n' ' ')"
}

# One at a time with the node's prologs: slurmd killed and started again may run a lost job's
# epilog late, while the next job's prolog puts the same GPUs back from the same record and
# locks them for itself. The record is read under the node's lock file, so whichever comes
# second finds it gone (and never restores the next job's lock).
turn() {
    mkdir -p "$STATE" 2>/dev/null
    { exec 9>>"$STATE/.turn" && flock -w 300 9; } 2>/dev/null ||
        log "could not take $STATE/.turn: restoring without waiting for the node's prologs"
}
turn
[ -f "$record" ] || { exec 9>&-; publish none; exit 0; }  # nothing locked, or put back already
gpus=$(cat "$record")
if out=$("$GPUENV" restore -i "$gpus" 2>&1); then
    rm -f "$record"
    exec 9>&-
    log "restored GPUs $gpus: $(printf '%s' "$out" | tr '\n' ' ')"
    publish yes
    exit 0
fi
exec 9>&-
log "could not restore GPUs $gpus: $(printf '%s' "$out" | tr '\n' ' ')"
publish no
exit 1
