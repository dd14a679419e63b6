"""The export side's copy of the scheduler's span tree and the readiness tracker
that decides, from events alone, when each span is over."""
