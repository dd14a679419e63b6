#!/usr/bin/env bash
# The cost of a span on a leased many-core machine, in one go (about 6 minutes on 16
# cores): the export process's floor, the accounting of `small` (8 pairs), the export
# process on one-task spans (`nested`), and one pair of the default workloads.
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

step floor bash -c "'$py' '$here/bench_floor.py' --prefixes 0 --metric-calls 4 && '$py' '$here/bench_floor.py' --prefixes 1 --metric-calls 4"
step small-account "$py" "$here/bench_account.py" --pairs 8
step nested-account "$py" "$here/bench_account.py" --workload nested --spans 2000 --pairs 2
step default "$py" "$here/bench_scheduler.py" --parts throughput --export-process --pairs 1 --time-limit 150
