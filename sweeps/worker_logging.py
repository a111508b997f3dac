"""Logging of the embedded cluster's workers (a Dask worker preload).

When the embedded ``LocalCluster`` closes, a worker's periodic heartbeat can be in flight while
the scheduler drops its connection; ``distributed`` then logs "Failed to communicate with
scheduler during heartbeat." with a full traceback, which the worker process writes on the
driver's stderr after a run that succeeded.  The embedded scheduler lives in the driver process,
so a worker of the embedded cluster that cannot reach it has nothing to tell the user: the
driver either closed it or is gone (a worker lost during a run is reported by the driver itself,
which watches the scheduler's list of workers).  This preload drops that one record in the embedded workers; every
other message, and every worker of an external cluster, is left as it is.
"""
from __future__ import annotations

import logging

#: the start of the message that is dropped (distributed.worker.Worker.heartbeat)
HEARTBEAT_FAILURE = "Failed to communicate with scheduler during heartbeat"


class DropHeartbeatFailure(logging.Filter):
    """A logging filter that drops :data:`HEARTBEAT_FAILURE` records and keeps all others."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(HEARTBEAT_FAILURE)


def install(logger_name: str = "distributed.worker") -> None:
    """Add :class:`DropHeartbeatFailure` to ``logger_name`` once (idempotent)."""
    if not installed(logger_name):
        logging.getLogger(logger_name).addFilter(DropHeartbeatFailure())


def installed(logger_name: str = "distributed.worker") -> bool:
    """Whether this process's ``logger_name`` has the filter (asked of the workers by the tests)."""
    return any(isinstance(f, DropHeartbeatFailure) for f in logging.getLogger(logger_name).filters)


def dask_setup(worker) -> None:  # (Dask calls it in each worker process that preloads this module)
    install()
