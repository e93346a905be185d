"""The dashboard service (``python -m allot.services.dashboard``): HTTP pages, their JSON and
``/metrics`` over a timeline folded from the log (``service``); the JSON views (``api``),
the pages (``frame``, ``pages``, ``workload``) and the Prometheus exposition (``metrics``)."""
