"""The placement service (``python -m allot.services.placement``).

``service`` (the cycle loop and wiring, ``main``), ``lease`` (leader lease and epochs),
``records`` (a cycle's result as the records to publish, pure), ``queries`` (the query
handlers and their cache), ``answers`` (the answers' wire rows, pure), ``queued`` (queue
positions and their pacing), ``ranking`` (the last ranking as placement uses it),
``histogram`` (cycle durations)."""
