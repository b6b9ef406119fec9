"""Value types shared by the server and client runtimes."""

from __future__ import annotations

from dataclasses import dataclass, field

from rda.serialization._data import Data
from rda.serialization._header import DataContext

__all__ = ["AcquiredData"]


@dataclass(frozen=True, slots=True)
class AcquiredData:
    """A value with its acquisition context: what ``get`` returns and ``notify`` sends."""

    data: Data
    context: DataContext = field(default_factory=DataContext)
