#!/usr/bin/env bash
# The cost of a span on a leased many-core machine, in one go (about 6 minutes on 16
# cores): the export process against its floor (bench_target.py, on a recording of
# `nested`), the scheduler process between fresh clusters (bench_between.py, 8 pairs),
# and the export process against the scheduler on one-task spans (`nested`).
#
#     benchmarks/leased.sh OUTDIR            # figures into OUTDIR/*.txt
#     PYTHON=/path/to/python benchmarks/leased.sh OUTDIR
#
# Each step writes its own file and a failed step does not stop the others.
set -u
out=${1:?usage: benchmarks/leased.sh OUTDIR}
py=${PYTHON:-python3}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
export PYTHONUNBUFFERED=1

step() {  # step NAME COMMAND...: run COMMAND, its output into OUTDIR/NAME.txt
    local name=$1
    shift
    echo "== $name: $*"
    local t0=$SECONDS
    "$@" 2>&1 | tee "$out/$name.txt" | tail -n 25
    echo "== $name took $((SECONDS - t0)) s"
}

{
    echo "date $(date -u +%FT%TZ)"
    echo "commit $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    "$py" -c "import os, platform; print('cores', os.cpu_count(), platform.python_version(), platform.processor() or platform.machine())"
    "$py" -c "import distributed, opentelemetry.sdk.version as v; print('distributed', distributed.__version__, 'otel sdk', v.__version__)"
} | tee "$out/machine.txt"

step target bash -c "'$py' '$here/bench_replay.py' '/tmp/leased-nested.msgs' --record && '$py' '$here/bench_target.py' '/tmp/leased-nested.msgs' --repeat 3"
step between "$py" "$here/bench_between.py" --pairs 8
step nested-account "$py" "$here/bench_account.py" --workload nested --spans 2000 --pairs 2
