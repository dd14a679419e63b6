"""The scheduler side: the plugin's hooks and lifecycle, and what runs on the
scheduler's event loop (the forwarder, the task sampler, snapshots of task groups,
the event loop's statistics). Imports nothing from the export side."""
