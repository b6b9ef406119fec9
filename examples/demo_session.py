"""A client session against the demo equipment server (what ``make demo`` runs).

Starts the demo server in this process on a free port, then with a ``rda.ClientService``: a get,
a set, a subscription showing its FIRST, IMMEDIATE and a few NORMAL updates, the 2-D orbit of
the beam position monitor, a rejected set and the FAULTY device's error. Stops everything and
exits 0.
"""

from __future__ import annotations

import sys
import threading
import time

import rda
from rda.demo import build_demo_server


def stamp(context: rda.DataContext) -> str:
    seconds = context.acq_stamp / 1e9
    millis = int(context.acq_stamp // 1_000_000 % 1000)
    return time.strftime("%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


def main() -> int:
    before = set(threading.enumerate())
    server = build_demo_server(directory=None).start()
    print(f"== demo server {server.name} on {server.endpoint}: {', '.join(server.devices())}")
    directory = rda.StaticDirectory({name: server.endpoint for name in server.devices()})
    try:
        with rda.ClientService(directory=directory) as client:
            setting = client.access_point("PS1", "Setting")
            acquisition = client.access_point("PS1", "Acquisition")

            print("\n-- get PS1/Setting")
            print(f"   {setting.get(timeout=5).data}")

            print("\n-- subscribe PS1/Setting")
            sub = setting.subscribe()
            first = sub.poll(5)
            assert first is not None and first.update_type is rda.UpdateType.FIRST
            print(f"   {first.update_type.name:9} seq={first.seq} {first.data}")

            print("\n-- set PS1/Setting current=12.5 A")
            setting.set({"current": 12.5}, timeout=5)
            immediate = sub.poll(5)
            assert immediate is not None and immediate.update_type is rda.UpdateType.IMMEDIATE
            print(f"   {immediate.update_type.name:9} seq={immediate.seq} {immediate.data}")
            sub.close()

            print("\n-- subscribe PS1/Acquisition (published at 10 Hz, following the setting)")
            acq_sub = acquisition.subscribe()
            for _ in range(6):
                n = acq_sub.poll(5)
                assert n is not None
                ctx = n.context
                print(
                    f"   {n.update_type.name:9} seq={n.seq:<3} gap={n.gap} "
                    f"{ctx.cycle_name or '-':16} {stamp(ctx)} "
                    f"current={n.data['current']:8.4f} A"
                )
            acq_sub.close()

            print("\n-- get BPM1/Orbit")
            orbit = client.access_point("BPM1", "Orbit").get(timeout=5).data
            array = orbit.get_array("orbit")
            print(
                f"   orbit {array.dtype}{list(array.shape)}: H[:4]={array[0, :4].round(3)} "
                f"V[:4]={array[1, :4].round(3)}; {len(orbit.get_array('positions'))} monitors"
            )

            print("\n-- set PS1/Setting current=250 A (outside -100..100)")
            try:
                setting.set({"current": 250.0}, timeout=5)
            except rda.RemoteError as exc:
                print(f"   refused: {type(exc).__name__}: {exc.message}")

            print("\n-- get FAULTY/Status (fails on purpose)")
            try:
                client.access_point("FAULTY", "Status").get(timeout=5)
            except rda.RdaError as exc:
                print(f"   {type(exc).__name__}: {exc}")

            stats = server.statistics()
            # Every (type, outcome) exists from the start (at 0): show the ones that moved.
            counted = {f"{t}/{o}": n for (t, o), n in sorted(stats.requests.items()) if n}
            print(f"\n== server counted {counted}; {stats.notifications_sent} notifications sent")
    finally:
        server.stop()
    leaked = [t.name for t in threading.enumerate() if t not in before and t.is_alive()]
    if leaked:
        print(f"threads still running: {leaked}", file=sys.stderr)
        return 1
    print("== stopped cleanly")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
