"""The export side, in the export child process or on a thread of the scheduler: the
export session, readiness tracking, translation (traces, task spans, metrics) and the
pipeline into the OTel SDK."""
