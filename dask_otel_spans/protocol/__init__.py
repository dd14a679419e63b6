"""What the sides share and nothing else: the messages from the scheduler to the export
side and their framing on the pipe, context propagation, the client's close notice,
task records and span snapshots, and facts about dask. Imports no side."""
