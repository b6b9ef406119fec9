"""The panel's pure parts: rendering values for the browser, and coalescing updates per view."""

from __future__ import annotations

import base64

import numpy as np
import pytest

pytest.importorskip("starlette")

from rda.business.client.subscriptions import Notification
from rda.panel.render import IMAGE_MAX, LINE_ROWS, context_json, data_json, decimate, image
from rda.panel.views import MAX_POINTS, ViewSlot
from rda.serialization.data import Data
from rda.serialization.errors import DisconnectedError, NotAuthorizedError
from rda.serialization.header import DataContext, UpdateType
from rda.testing import FakeClock

# -- render ----------------------------------------------------------------------------------


def test_a_short_array_travels_whole() -> None:
    out = decimate(np.array([1.0, np.nan, 3.0]), columns=10)
    assert out == {"length": 3, "x": None, "y": [1.0, None, 3.0]}


def test_a_1_mib_array_is_cut_to_min_and_max_per_pixel_column() -> None:
    values = np.zeros(131_072)  # 1 MiB of float64
    values[70_001] = 9.5  # one spike, and one dip: both must survive
    values[3] = -4.0
    out = decimate(values, columns=1000)
    assert out["length"] == 131_072
    assert len(out["x"]) == len(out["min"]) == len(out["max"]) == 1000
    assert max(out["max"]) == 9.5 and min(out["min"]) == -4.0
    column = max(i for i, start in enumerate(out["x"]) if start <= 70_001)
    assert out["max"][column] == 9.5
    assert out["x"][0] == 0 and out["x"] == sorted(out["x"])


def test_a_2d_array_becomes_grey_levels_with_its_true_shape_and_range() -> None:
    values = np.arange(6, dtype=np.float64).reshape(2, 3)
    out = image(values)
    assert (out["width"], out["height"], out["shape"]) == (3, 2, [2, 3])
    assert (out["min"], out["max"]) == (0.0, 5.0)
    grey = np.frombuffer(base64.b64decode(out["pixels"]), dtype=np.uint8)
    assert grey.tolist() == [0, 51, 102, 153, 204, 255]


def test_a_big_image_is_reduced_by_block_maximum() -> None:
    values = np.zeros((1000, 600))
    values[999, 599] = 1.0  # in the last, partial block
    out = image(values)
    assert out["height"] <= IMAGE_MAX and out["width"] <= IMAGE_MAX
    grey = np.frombuffer(base64.b64decode(out["pixels"]), dtype=np.uint8)
    grey = grey.reshape(out["height"], out["width"])
    assert grey[-1, -1] == 255 and grey.sum() == 255


def test_an_orbit_travels_as_rows_named_and_placed_by_its_sibling_fields() -> None:
    orbit = np.vstack([np.linspace(-1, 1, 64), np.linspace(2, 3, 64)])
    positions = np.arange(64) * 9.8
    fields = data_json(Data(orbit=orbit, positions=positions, planes=["H", "V"]), columns=600)
    (field,) = [f for f in fields if f["name"] == "orbit"]
    assert field["kind"] == "image" and field["shape"] == [2, 64]
    assert [row["y"] for row in field["rows"]] == [orbit[0].tolist(), orbit[1].tolist()]
    assert field["row_labels"] == ["H", "V"]
    assert field["x_name"] == "positions" and field["x"] == positions.tolist()
    # A tall image is no set of lines; one without siblings gets no labels.
    (tall,) = data_json(Data(frame=np.zeros((LINE_ROWS + 1, 8))))
    assert "rows" not in tall and "row_labels" not in tall and "x" not in tall


def test_fields_keep_their_types_and_nesting() -> None:
    data = Data(current=1.5, count=3, ok=True, unit="A")
    data["inner"] = Data(depth=np.int32(2))
    data["orbit"] = np.ones((2, 4))
    data["trace"] = np.arange(5, dtype=np.int16)
    data["names"] = ["H", "V"]
    out = {f["name"]: f for f in data_json(data)}
    assert out["current"] == {"name": "current", "type": "FLOAT64", "kind": "scalar", "value": 1.5}
    assert out["count"]["type"] == "INT64" and out["count"]["value"] == 3
    assert out["ok"]["value"] is True and out["unit"]["kind"] == "string"
    assert out["inner"]["kind"] == "data"
    assert out["inner"]["fields"][0]["type"] == "INT32"
    assert out["orbit"]["kind"] == "image" and out["trace"]["kind"] == "array"
    assert out["trace"]["y"] == [0, 1, 2, 3, 4] and out["trace"]["type"] == "INT16_ARRAY"
    assert out["names"] == {
        "name": "names",
        "type": "STRING_ARRAY",
        "kind": "strings",
        "items": ["H", "V"],
        "shape": [2],
    }


def test_context_json() -> None:
    ctx = DataContext("CPS.USER.MD1", 10, 20, "CPS.USER.ALL")
    assert context_json(ctx) == {
        "cycle_name": "CPS.USER.MD1",
        "cycle_stamp": 10,
        "acq_stamp": 20,
        "selector": "CPS.USER.ALL",
    }


# -- coalescing -----------------------------------------------------------------------------


def _value(x: float, kind: UpdateType = UpdateType.NORMAL, gap: int = 0) -> Notification:
    context = DataContext("C", 1, int(1e18 + x * 1e9), "")
    return Notification(Data(current=x, unit="A"), context, kind, gap=gap)


def test_a_slot_folds_updates_between_frames_and_wakes_the_tab_once() -> None:
    wakes: list[int] = []
    slot = ViewSlot("v", lambda: wakes.append(1))
    assert slot.take() is None
    for i in range(1000):
        slot.offer(_value(float(i), gap=1 if i == 500 else 0))
    assert len(wakes) == 1
    frame = slot.take()
    assert frame is not None
    assert frame.folded == 1000 and frame.received == 1000 and frame.gap == 1
    assert frame.notification is not None and frame.notification.data["current"] == 999.0
    assert frame.status == "ok" and frame.update_type == "NORMAL" and not frame.first
    assert slot.take() is None  # nothing new: no frame
    slot.offer(_value(1000.0))
    assert len(wakes) == 2
    frame = slot.take()
    assert frame is not None and frame.folded == 1 and frame.received == 1001


def test_a_first_folded_under_later_updates_is_still_reported() -> None:
    slot = ViewSlot("v", lambda: None)
    slot.offer(_value(1.0, UpdateType.FIRST))
    slot.offer(_value(2.0))
    frame = slot.take()
    assert frame is not None and frame.first and frame.update_type == "NORMAL"
    slot.offer(_value(3.0))
    frame = slot.take()
    assert frame is not None and not frame.first


def test_errors_turn_the_view_red_and_the_next_value_green() -> None:
    slot = ViewSlot("v", lambda: None)
    slot.offer(_value(1.0, UpdateType.FIRST))
    lost = DisconnectedError("PS1/Acquisition: connection to tcp://x lost; reconnecting")
    slot.offer(Notification(error=lost))
    frame = slot.take()
    assert frame is not None and frame.status == "error"
    assert frame.error == f"DisconnectedError: {lost}"
    assert frame.header()["context"] is None
    # A disconnection, not any error: the browser disables the set form on this flag.
    assert frame.disconnected and frame.header()["disconnected"] is True
    slot.offer(_value(2.0, UpdateType.FIRST))
    frame = slot.take()
    assert frame is not None and frame.status == "ok" and frame.error is None and frame.first
    assert not frame.disconnected


def test_a_denied_subscription_shows_the_not_authorized_text() -> None:
    slot = ViewSlot("v", lambda: None)
    slot.offer(Notification(error=NotAuthorizedError("PS1/Setting: viewer may not get")))
    frame = slot.take()
    assert frame is not None
    assert frame.error == "NotAuthorizedError: PS1/Setting: viewer may not get"
    assert not frame.disconnected  # refused, but the server is there


def test_series_slots_keep_the_numeric_points_bounded() -> None:
    slot = ViewSlot("v", lambda: None, series=True)
    for i in range(MAX_POINTS * 4):
        slot.offer(_value(float(i)))
    frame = slot.take()
    assert frame is not None
    points = frame.points["current"]
    assert len(points) <= MAX_POINTS and "unit" not in frame.points
    assert points[-1][1] == float(MAX_POINTS * 4 - 1)  # the newest is always kept
    assert [p[0] for p in points] == sorted(p[0] for p in points)


def test_the_rate_is_measured_over_at_least_a_second() -> None:
    clock = FakeClock()
    slot = ViewSlot("v", lambda: None, clock=clock)
    for _ in range(50):
        slot.offer(_value(1.0))
    clock.advance(0.5)
    frame = slot.take()
    assert frame is not None and frame.rate == 0.0  # not a second yet
    for _ in range(50):
        slot.offer(_value(1.0))
    clock.advance(0.5)
    frame = slot.take()
    assert frame is not None and frame.rate == pytest.approx(100.0)
