"""What ``otel-spans.profile.otlp`` costs to encode: one prefix profile of
``profile.max-stacks`` (2000) distinct stacks, 20 frames deep over 200 functions, as an
OTLP profiles request (``protocol/otlpprofiles.py``); CPU time of the thread, best and
median of 7, and the request's bytes. Paid on the profiles sender's thread of the
export process.

    python benchmarks/bench_otlp_profiles.py
"""
from __future__ import annotations

import time

from dask_otel_spans.protocol.otlpprofiles import LinkedProfile, profiles_request
from dask_otel_spans.protocol.profiles import Frame, from_stacks


def main() -> None:
    stacks = [(tuple(Frame(f"f{(i * 7 + d) % 200}", f"/x/m{d % 10}.py", d)
                     for d in range(20)), i + 1) for i in range(2000)]
    profile = [LinkedProfile(from_stacks(stacks), 1, 2, 0, 10, {"dask.task.prefix": "p"})]
    times = []
    for _ in range(7):
        start = time.thread_time()
        data = profiles_request(profile, {"service.name": "bench"}, ("bench", "0"))
        times.append(time.thread_time() - start)
    times.sort()
    print(f"2000 stacks x 20 frames: {times[0] * 1e3:.1f} ms CPU best, "
          f"{times[3] * 1e3:.1f} ms median; {len(data):,} bytes")


if __name__ == "__main__":
    main()
