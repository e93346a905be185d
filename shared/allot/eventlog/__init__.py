"""The event-sourced state: the pure fold of log records into the core's state (``LogFold``),
each host's work list, the timeline of a run and the owed-vs-delivered view. No I/O: the
services read the log and hand its records here (an import contract keeps it so)."""
