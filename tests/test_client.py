"""The client helper's close notice, as the scheduler receives it: whether the block
left lazy collections behind, and which client closed it."""
from __future__ import annotations

import dask
import dask.array as da
from distributed.utils_test import gen_cluster, inc

from dask_otel_spans import names, span

from conftest import async_wait_for


def notices(s) -> dict[str, dict]:
    """The close notices the scheduler logged, by the last tag of the block."""
    out = {}
    for _, msg in s.get_events(names.EVENT_TOPIC):
        for notice in msg if isinstance(msg, (list, tuple)) else [msg]:
            out[notice["name"][-1]] = notice
    return out


@gen_cluster(client=True, nthreads=[])
async def test_block_without_collections_is_not_lazy(c, s):
    with span("nothing"):
        pass
    notice = (await async_wait_for(lambda: notices(s).get("nothing")))
    assert notice["lazy"] is False
    assert notice["client"] == c.id


@gen_cluster(client=True, nthreads=[])
async def test_delayed_built_in_block_and_kept_makes_it_lazy(c, s):
    with span("deferred"):
        d = dask.delayed(inc)(1)
    notice = await async_wait_for(lambda: notices(s).get("deferred"))
    assert notice["lazy"] is True
    assert d is not None


@gen_cluster(client=True, nthreads=[])
async def test_collection_dropped_in_block_is_not_lazy(c, s):
    with span("dropped"):
        dask.delayed(inc)(1)
    notice = await async_wait_for(lambda: notices(s).get("dropped"))
    assert notice["lazy"] is False


@gen_cluster(client=True, nthreads=[])
async def test_lazy_inner_block_makes_its_outer_block_lazy(c, s):
    with span("outer"):
        with span("inner"):
            arr = da.ones(4, chunks=2) + 1
        with span("sibling"):
            pass
    found = await async_wait_for(lambda: len(notices(s)) == 3 and notices(s))
    assert found["inner"]["lazy"] is True
    assert found["sibling"]["lazy"] is False
    assert found["outer"]["lazy"] is True
    assert arr is not None
