# Sourced by scripts/device-test, device-bench and device-docs (bash), on the GPU machine:
# the wheels the machine lacks (.whl/, nvitop, ...) into /tmp/site, this checkout on
# PYTHONPATH, and GPUENV_READONLY=1: every gpuenv write refuses before it reaches the
# shared GPU. `step` runs one step under its own time limit, so one that hangs cannot
# take the others' time (nor the call's).

# first, before anything that can fail: no gpuenv write reaches the shared GPU
export GPUENV_READONLY=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site:$PYTHONPATH"
fi
export PYTHONUNBUFFERED=1

step() {  # step SECONDS LOG TITLE -- command...   (logs to $out/LOG; needs $out)
    local limit=$1 log=$2 title=$3
    shift 4
    local t0=$SECONDS
    echo "== $title  ($(date -u +%H:%M:%S))" >>"$out/$log"
    timeout -k 5 "$limit" "$@" >>"$out/$log" 2>&1
    echo "== rc=$? after $((SECONDS - t0)) s: $title" | tee -a "$out/$log"
}
