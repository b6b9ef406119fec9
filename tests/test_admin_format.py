"""Human output helpers: durations, arrays, tables, JSON conversion."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from rda.admin.format import (
    dumps,
    format_bytes,
    format_duration,
    format_mapping,
    format_table,
    format_timestamp,
    format_value,
    humanize,
    summarize_array,
)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0 s"),
        (4.2e-7, "420 ns"),
        (0.00042, "420 µs"),
        (0.0123, "12.3 ms"),
        # Just under a unit boundary: rounded first, then the unit chosen (not "1e+03 µs").
        (0.0009996, "1 ms"),
        (9.996e-7, "1 µs"),
        (0.99996, "1 s"),
        (12.5, "12.5 s"),
        (125.0, "2 min 5 s"),
        (3725.0, "1 h 2 min"),
        (90000.0, "1 d 1 h"),
        (-0.5, "-500 ms"),
        (math.nan, "n/a"),
    ],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_format_bytes() -> None:
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(3 * 1024**3) == "3.0 GiB"


def test_summarize_arrays() -> None:
    wave = np.linspace(-1.2, 3.4, 128).reshape(2, 64)
    assert summarize_array(wave) == "float64[2x64] min=-1.2 max=3.4"
    assert summarize_array(np.array([1, 2, 3], dtype=np.int32)) == "int32[3] [1, 2, 3]"
    assert summarize_array(np.zeros(0)) == "float64[0]"
    assert summarize_array(np.array([np.nan] * 10)) == "float64[10] (no finite values)"
    names = np.array([["a", "b"], ["c", "d"]], dtype=object)
    assert summarize_array(names) == "str[2x2] [a, b, c, ...]"


def test_format_value_scalars_and_nesting() -> None:
    assert format_value(True) == "true"
    assert format_value(np.float32(2.5)) == "2.5"
    assert format_value(3.0) == "3.0"
    assert format_value({"a": 1, "b": [1, 2]}) == "{a=1, b=[1, 2]}"
    assert format_value(list(range(20))) == "[20 items]"


def test_format_mapping_nests_and_tabulates() -> None:
    text = format_mapping({"n": 1, "inner": {"x": 2.5}, "rows": [{"a": 1}, {"a": 2, "b": "z"}]})
    assert text.splitlines() == ["n  1", "inner:", "  x  2.5", "rows:", "  A  B", "  1", "  2  z"]
    assert format_mapping({}) == "(empty)"


def test_format_table_shows_an_empty_list_as_a_dash() -> None:
    # An empty list of roles crosses the wire as an empty float64 array.
    table = format_table([{"peer": "a", "roles": np.zeros(0)}, {"peer": "b", "roles": []}])
    assert table.splitlines()[1:] == ["a     -", "b     -"]


def test_format_table_columns() -> None:
    table = format_table([{"name": "PS1", "n": 3}], columns=["name"])
    assert table.splitlines() == ["NAME", "PS1"]
    assert format_table([]) == "(none)"


def test_humanize_times_and_durations() -> None:
    out = humanize({"uptime": 3725.0, "clients": [{"last_heard": 1000.0, "peer": "ab"}]})
    assert out["uptime"] == "1 h 2 min"
    assert out["clients"][0]["peer"] == "ab"
    assert out["clients"][0]["last_heard"] == format_timestamp(1000.0)
    aged = humanize({"last_update": 1000.0}, now=1010.0)
    assert aged["last_update"].endswith("(10 s ago)")


def test_dumps_handles_numpy_and_nan() -> None:
    doc = json.loads(dumps({"a": np.arange(3), "f": np.float32(1.5), "x": math.nan, "b": b"\x01"}))
    assert doc == {"a": [0, 1, 2], "f": 1.5, "x": None, "b": "01"}
