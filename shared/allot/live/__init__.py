"""The live system's shell: the log fold, streams, the services' runtime and the stack.

Nothing here decides policy: placement calls ``allot.core.cycle.run_cycle`` and the fold
applies log records with the core's ``ClusterState`` and ``PendingQueue``.
"""
