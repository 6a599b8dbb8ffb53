"""Workers: claim loop, heartbeats, isolated child processes, metrics."""
