"""Value types shared by the server and client runtimes."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from rda.serialization._data import Data
from rda.serialization._header import DataContext

__all__ = ["AcquiredData", "stamped"]


@dataclass(frozen=True, slots=True)
class AcquiredData:
    """A value with its acquisition context: what ``get`` returns and ``notify`` sends."""

    data: Data
    context: DataContext = field(default_factory=DataContext)


def stamped(acquired: AcquiredData) -> AcquiredData:
    """``acquired`` with ``acq_stamp`` set to now (wall clock, ns, UTC) when it has none.

    RDA3 stamps an acquisition with the time it was made when the server gives none; the
    server calls this at the moment of ``complete``/``notify``, the closest it knows to that
    time. A zero stamp would put the value at 1970-01-01, where no time window of a history
    query finds it. Only the context is replaced; the data is shared, never copied.
    """
    context = acquired.context
    if context.acq_stamp:
        return acquired
    return AcquiredData(
        acquired.data,
        DataContext(context.cycle_name, context.cycle_stamp, time.time_ns(), context.selector),
    )
