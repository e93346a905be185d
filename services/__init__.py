"""The live system's services, one module each (``python -m allot.services.<name>``).

Each builds a FastStream app around a ``NatsBroker`` with thin handlers: decode, fetch the
state, call the core, publish what it returns. ``allot.bus.service_main`` runs one.
"""
