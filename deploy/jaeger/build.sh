#!/usr/bin/env bash
# Build Jaeger v2 (github.com/jaegertracing/jaeger/cmd/jaeger, the version
# pinned in go.mod/go.sum next to this script) from the Go module proxy, once,
# into a cache directory, and print the binary's path.  A binary already there
# is reused.  The first build takes long (see README, "Development").
#
# One build at a time per cache directory: a second run (another test process,
# another shell) waits for the one building (a lock, flock(1)), then prints the
# binary that one built.
#
# build.sh --where: print the path the binary has (or will have) and build nothing.
#
# Environment: GO (default: go on PATH, else /usr/local/go/bin/go),
# DASK_OTEL_SPANS_JAEGER (a binary to use instead; printed as is),
# XDG_CACHE_HOME (default ~/.cache).
set -euo pipefail

if [[ -n "${DASK_OTEL_SPANS_JAEGER:-}" ]]; then
    echo "$DASK_OTEL_SPANS_JAEGER"
    exit 0
fi

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
version="$(awk '$1 == "github.com/jaegertracing/jaeger" {print $2}' "$here/go.mod")"
out_dir="${XDG_CACHE_HOME:-$HOME/.cache}/dask-otel-spans/jaeger-${version}"
out="$out_dir/jaeger"

if [[ "${1:-}" == "--where" || -x "$out" ]]; then
    echo "$out"
    exit 0
fi

go_bin="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
mkdir -p "$out_dir"
# (held until this script exits; the one that waited finds the binary built)
exec 9>"$out_dir/.build.lock"
if ! flock -n 9; then
    echo "waiting for the jaeger build running into ${out_dir}" >&2
    flock 9
fi
if [[ -x "$out" ]]; then
    echo "$out"
    exit 0
fi
echo "building jaeger ${version} into ${out} (first build takes minutes)" >&2
(
    cd "$here"
    # -mod=readonly: go.mod and go.sum pin every module the build needs (fetched
    # from the module proxy into GOMODCACHE); the build never rewrites them.
    GOFLAGS=-mod=readonly nice -n 10 "$go_bin" build -trimpath -buildvcs=false \
        -ldflags="-s -w -X github.com/jaegertracing/jaeger/internal/version.latestVersion=${version}" \
        -o "$out.tmp.$$" github.com/jaegertracing/jaeger/cmd/jaeger
)
mv -f "$out.tmp.$$" "$out"
echo "$out"
