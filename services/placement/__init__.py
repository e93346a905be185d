"""The placement service (``python -m allot.services.placement``): the leader's scheduling
cycle over the log's state and its queries (``service``)."""
