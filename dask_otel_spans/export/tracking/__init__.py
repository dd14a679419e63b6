"""Readiness tracking: the span tree copy and the pure bookkeeping that decides when
each dask span is ready to be handed over."""
