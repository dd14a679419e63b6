"""What an export process had allocated and not freed when it ended, from a capture of
``bench_memory.py --memray DIR``: pymalloc's arenas (1 MiB each: Python's small
objects) apart from the rest (malloc: C extensions, gRPC, protobuf, large objects).

    python benchmarks/memray_live.py DIR/export-PID.memray
"""
from __future__ import annotations

import collections
import sys

from memray import FileReader


def main(path: str, top: int = 12) -> None:
    arenas = other = count = 0
    by: collections.Counter[str] = collections.Counter()
    for record in FileReader(path).get_leaked_allocation_records(merge_threads=True):
        stack = record.hybrid_stack_trace(max_stacks=40)
        names = [frame[0] for frame in stack]
        if "new_arena" in names:
            arenas += record.size
            count += record.n_allocations
            continue
        other += record.size
        python = [frame[0] for frame in stack if frame[1].endswith(".py")][:3]
        by[" < ".join(names[:3]) + " | " + " < ".join(python)] += record.size
    print(f"{path}: pymalloc arenas {count} ({arenas / 2**20:.1f} MiB), "
          f"other allocations {other / 2**20:.1f} MiB")
    for where, size in by.most_common(top):
        print(f"  {size / 2**20:6.2f} MiB  {where}")


if __name__ == "__main__":
    main(sys.argv[1])
