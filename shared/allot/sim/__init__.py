"""The discrete-event simulator: replays traces through the core's one entry point."""
