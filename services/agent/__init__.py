"""The host agent (``python -m allot.services.agent``): runs a host's work list and reports
its runs (``service``), executing real processes (``gpu_exec``) and batching fake hosts'
reports (``report_batch``)."""
