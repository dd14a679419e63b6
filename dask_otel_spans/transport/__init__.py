"""Between the scheduler and the export side: where the export session runs, chosen
once (a thread, or an export child process), the scheduler-side sender to the child
and its supervision, the child's entry point, and the forward budget."""
