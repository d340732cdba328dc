#!/bin/bash
# gpuenv Slurm Prolog: lock the GPU clocks of a job that asks for it.
#
#   install:     gpuenv ops install prolog epilog   # /etc/slurm/gpuenv-{prolog,epilog}.sh
#   slurm.conf:  Prolog=/etc/slurm/gpuenv-prolog.sh   Epilog=/etc/slurm/gpuenv-epilog.sh
#   a job asks:  sbatch --gres=gpu:2 --comment "gpuenv:sm=1350" job.sh
#                (also sm=1200-1500, sm=max|base|sustained, power=500, mem=MHZ;
#                 comma-separated, e.g. "gpuenv:sm=1350,power=600")
#                report=PATH: the epilog appends the job's one-line verdict there (else
#                to the job's output), as the job's user
#   or by a node feature: set GPUENV_SLURM_FEATURE=gpuenv-lock (and GPUENV_SLURM_SM, the
#                clock to lock, default "sustained") and submit with -C gpuenv-lock.
#
# Runs as root on the compute node (slurmd) before the job. The lock is a standing
# gpuenv lock on the job's GPUs (SLURM_JOB_GPUS), journaled like any other: the
# Epilog (gpuenv-epilog.sh) runs 'gpuenv restore' on the same GPUs, and the state that
# was there before is put back exactly. Users see the lock in 'gpuenv status'.
# When gpuenvd runs on the node, 'gpuenv lock' takes the lock from it (a standing
# lease owned by root, which the epilog's 'gpuenv restore' ends): one authority.
#
# A lock that fails never fails the job (that would DOWN the node and requeue
# it): it is logged (syslog tag gpuenv-slurm, and $STATE/gpuenv-slurm.log) and the
# job runs unlocked; set GPUENV_SLURM_STRICT=1 to drain the node with the reason and
# fail the prolog instead (Slurm requeues the job, held).
#
# Note: SLURM_JOB_GPUS holds the GPU numbers from gres.conf, which match NVML
# indices when gres.conf uses AutoDetect=nvml or lists /dev/nvidiaN in order.

set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# the site's settings (slurmd gives prologs and epilogs only SLURM_*): root's file only
site=/etc/default/gpuenv-slurm
# shellcheck disable=SC1090
if [ -f "$site" ] && [ -O "$site" ]; then . "$site"; fi
GPUENV=${GPUENV:-gpuenv}
STATE=${GPUENV_SLURM_STATE:-/run/gpuenv/slurm}
JOB=${SLURM_JOB_ID:?the gpuenv prolog runs under slurmd, which sets SLURM_JOB_ID}
gpus=${SLURM_JOB_GPUS-}
spec=

log() {
    logger -t gpuenv-slurm -- "job $JOB: $*" 2>/dev/null || true
    echo "gpuenv-slurm: job $JOB: $*" >&2
    # slurmd drops a prolog's output: the node's own log is where an admin finds it
    { mkdir -p "$STATE" && echo "$(date -u +%FT%TZ) job $JOB: $*" >> "$STATE/gpuenv-slurm.log"; } 2>/dev/null || true
}
# gpuenvd records the job's GPUs until the epilog (`gpuenv job JOBID`): every GPU job, asked
# or not, unless GPUENV_SLURM_REPORT=0. No daemon: logged, and the job runs as it would.
# With GPUENV_JOBS_DIR (a directory every node shares) the node marks there that it has the
# job: `gpuenv job JOBID` then names a node whose epilog never reported.
record() {
    [ "${GPUENV_SLURM_REPORT:-1}" = 1 ] || return 0
    "$GPUENV" job "$JOB" --begin -i "$gpus" --user "${SLURM_JOB_USER:-?}" \
        --asked "${spec:--}" --lock "$1" --jobs-dir "${GPUENV_JOBS_DIR-}" >/dev/null 2>&1 && return 0
    # a job that did not ask, on a node without gpuenvd: nothing worth a line per job
    [ "$1" = "not asked" ] || log "not recorded: no gpuenvd answers ('gpuenv job $JOB' will not know it)"
}
fail() {
    log "$*"
    if [ "${GPUENV_SLURM_STRICT:-0}" != 1 ]; then record "not locked: $*"; exit 0; fi
    scontrol update nodename="${SLURMD_NODENAME:-$(hostname -s)}" state=drain \
        reason="gpuenv: job $JOB could not lock its GPUs (see $STATE/gpuenv-slurm.log)" \
        >/dev/null 2>&1 || log "could not drain the node"
    exit 1
}

# What the job asked for: "gpuenv:..." in its comment, or the node feature.
comment=${SLURM_JOB_COMMENT-}
if [ -z "$comment" ] && command -v scontrol >/dev/null 2>&1; then
    comment=$(scontrol show job -o "$JOB" 2>/dev/null | sed -n 's/.* Comment=//p')
fi
spec=$(printf '%s' "$comment" | sed -n 's/.*gpuenv:\([A-Za-z0-9=,.\/_~+-]*\).*/\1/p')
if [ -z "$spec" ] && [ -n "${GPUENV_SLURM_FEATURE-}" ]; then
    case ",${SLURM_JOB_CONSTRAINTS-}," in
        *",$GPUENV_SLURM_FEATURE,"*|*"&$GPUENV_SLURM_FEATURE"*|*"$GPUENV_SLURM_FEATURE&"*)
            spec="sm=${GPUENV_SLURM_SM:-sustained}" ;;
    esac
fi

if [ -z "$gpus" ]; then
    [ -z "$spec" ] || fail "asked for locked clocks ($spec) but has no GPUs (SLURM_JOB_GPUS is empty)"
    exit 0  # no GPUs: nothing to lock or report
fi
case "$gpus" in *[!0-9,]*) fail "unexpected SLURM_JOB_GPUS=$gpus";; esac

# One at a time with the node's epilogs (a lost job's epilog may run late, after slurmd
# started again): the stale records below and this job's own are read and written under the
# node's lock file, held until the prolog ends.
mkdir -p "$STATE" 2>/dev/null
{ exec 9>>"$STATE/.turn" && flock -w 300 9; } 2>/dev/null ||
    log "could not take $STATE/.turn: going on without waiting for the node's epilogs"

# A job whose epilog never ran (slurmd killed while the job ended: Slurm does not run it
# again) left its lock. Slurm gives a job its GPUs alone, so another job's record on ours
# is stale: put those GPUs back before this job starts (its own lock, or none, then holds).
for rec in "$STATE"/job-*.gpus; do
    [ -f "$rec" ] || continue
    old=${rec##*/job-}; old=${old%.gpus}
    [ "$old" != "$JOB" ] || continue
    overlap=$(tr ',' '\n' < "$rec" | grep -Fx -f <(printf '%s\n' "$gpus" | tr ',' '\n') | paste -sd, -)
    [ -n "$overlap" ] || continue
    if out=$("$GPUENV" restore -i "$overlap" 2>&1); then
        rm -f "$rec"
        log "job $old's epilog never ran: restored GPUs $overlap it left locked"
    else
        log "could not restore GPUs $overlap left locked by job $old: $(printf '%s' "$out" | tr '\n' ' ')"
    fi
done

args=()
IFS=',' read -r -a items <<< "$spec"
for item in "${items[@]}"; do
    key=${item%%=*}; value=${item#*=}
    case "$key" in
        sm)
            case "$value" in
                *-*) args+=(--sm "${value%-*}" --sm-max "${value#*-}") ;;
                *) args+=(--sm "$value") ;;
            esac ;;
        mem) args+=(--mem "$value") ;;
        power) args+=(--power-limit "$value") ;;
        report) ;;  # the epilog's: where the job's one-line verdict goes
        *) fail "unknown setting '$key' in 'gpuenv:$spec' (use sm=, mem=, power=, report=)" ;;
    esac
done
if [ "${#args[@]}" -eq 0 ]; then record "not asked"; exit 0; fi

mkdir -p "$STATE" && chmod 0755 "$STATE"
if out=$("$GPUENV" lock "${args[@]}" -i "$gpus" 2>&1); then
    printf '%s\n' "$gpus" > "$STATE/job-$JOB.gpus"
    log "locked GPUs $gpus ($spec) for ${SLURM_JOB_USER:-?}: $(printf '%s' "$out" | tr '\n' ' ')"
    record "locked $spec"
else
    fail "could not lock GPUs $gpus ($spec): $(printf '%s' "$out" | tr '\n' ' ')"
fi
exit 0
