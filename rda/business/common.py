"""Value types shared by the server and client runtimes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rda.business import driver
from rda.business.metadata import NO_ALARM, Alarm
from rda.serialization.data import Data
from rda.serialization.header import DataContext

__all__ = ["AcquiredData", "new_acquired", "stamped", "stamped_data"]


# The context of a value given without one. DataContext is frozen, so one instance serves
# every AcquiredData made without a context (no new one per request).
_NO_CONTEXT = DataContext()


@dataclass(frozen=True, slots=True, init=False)
class AcquiredData:
    """A value with its acquisition context: what ``get`` returns and ``notify`` sends.

    ``alarm``: on a client, the alarm the server sent with a get's reply (``Alarm.NONE`` when
    it sent none); a server computes the alarms it sends from the declared limits and does not
    read this."""

    data: Data
    context: DataContext = _NO_CONTEXT
    alarm: Alarm = NO_ALARM

    # What a get handler writes for every request (``request.complete(AcquiredData(d))``,
    # docs/server.md): set through the slots, not the frozen dataclass's __init__ (an
    # object.__setattr__ per field and a new default context), a fifth of the cost
    # (docs/performance.md, "The documented handler").
    def __init__(
        self, data: Data, context: DataContext = _NO_CONTEXT, alarm: Alarm = NO_ALARM
    ) -> None:
        _SET_DATA(self, data)
        _SET_CONTEXT(self, context)
        if alarm is not NO_ALARM:
            _SET_ALARM(self, alarm)

    if not TYPE_CHECKING:  # type checkers keep reporting unknown attributes

        def __getattr__(self, name: str) -> Alarm:
            # Only reached for a slot never set: ``alarm`` is set only when there is one, so
            # that every get handler's AcquiredData and every get result without an alarm is
            # made without a third slot write (about a quarter of the construction measured).
            if name == "alarm":
                return NO_ALARM
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


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
    if context is _NO_CONTEXT and acquired.alarm is NO_ALARM:
        return stamped_data(acquired.data)
    return new_acquired(
        acquired.data,
        _context(context.cycle_name, context.cycle_stamp, driver.wall_time_ns(), context.selector),
        acquired.alarm,
    )


def stamped_data(data: Data) -> AcquiredData:
    """``stamped(AcquiredData(data))`` in one step: what a get answered with a bare ``Data``
    (the usual case) is replied with, once per get."""
    return new_acquired(data, _context("", 0, driver.wall_time_ns(), ""))


# Both built once per get reply: through the slots' descriptors, not the frozen dataclasses'
# __init__ (object.__setattr__ per field), measured a third of the cost (docs/performance.md,
# "Reply stamping through slots").
_new = object.__new__
_SET_DATA, _SET_CONTEXT, _SET_ALARM = (
    vars(AcquiredData)[name].__set__ for name in ("data", "context", "alarm")
)
_SET_NAME, _SET_CYCLE, _SET_ACQ, _SET_SELECTOR = (
    vars(DataContext)[name].__set__
    for name in ("cycle_name", "cycle_stamp", "acq_stamp", "selector")
)


def new_acquired(data: Data, context: DataContext, alarm: Alarm = NO_ALARM) -> AcquiredData:
    """``AcquiredData(data, context, alarm)`` built through the slots (every get's result)."""
    value: AcquiredData = _new(AcquiredData)
    _SET_DATA(value, data)
    _SET_CONTEXT(value, context)
    if alarm is not NO_ALARM:  # unset reads as NO_ALARM (AcquiredData.__getattr__)
        _SET_ALARM(value, alarm)
    return value


def _context(cycle_name: str, cycle_stamp: int, acq_stamp: int, selector: str) -> DataContext:
    context: DataContext = _new(DataContext)
    _SET_NAME(context, cycle_name)
    _SET_CYCLE(context, cycle_stamp)
    _SET_ACQ(context, acq_stamp)
    _SET_SELECTOR(context, selector)
    return context
