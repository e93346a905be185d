"""Operating the stack: the process supervisor behind ``allot up`` and ``allot demo``, its run
directory, NATS credentials and permissions generation, and loopback TLS certificates."""
