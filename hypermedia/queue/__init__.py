"""The job queue: states, use cases and retry policy. No SQL lives here."""
