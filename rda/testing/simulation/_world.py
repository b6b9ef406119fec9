"""One simulated run: servers and clients of the real business layer, faults, workload.

Everything that can vary between two runs is drawn from one ``random.Random(seed)``: the
topology, which message arrives next and when, which piece of background work runs next
(a dispatcher's next message, a scheduler's next task, a due timer), the workload and the
faults. Time is a ``SimClock`` (a ``FakeClock`` for one thread) that moves only when nothing can run
(to the next deadline, message arrival or planned event). See docs/testing.md.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rda.business.client.service import ClientService
from rda.business.config import Config
from rda.business.driver import driven_by, wall_clock
from rda.business.policy import Policy
from rda.business.server.builder import ServerBuilder
from rda.business.server.runtime import Server
from rda.serialization.data import Data
from rda.serialization.errors import NoSuchDeviceError
from rda.testing.simulation._devices import HandlerFaults, SimDevice
from rda.testing.simulation._driver import Adopted, SimClock, SimDriver, SimWallClock
from rda.testing.simulation._invariants import (
    AdminWatch,
    Checker,
    LogWatch,
    RequestWatch,
    SubWatch,
)
from rda.testing.simulation._model import InvariantBroken, SimSettings, Trace
from rda.testing.simulation._network import Flight, SimNetwork

__all__ = ["START", "RunResult", "Simulation"]

#: Faults that are not drawn by ``_fault``: they act all the time, or (clock steps) come
#: from a stream of their own.
_BACKGROUND = frozenset({"delay", "handler-error", "overrun", "clock-step"})

#: How far a wall clock steps (either way): a leap second, NTP slewing in, a date set by
#: hand, a time zone mistaken for UTC, a VM restored from a snapshot.
_CLOCK_STEPS = (0.5, 2.0, 30.0, 600.0, 3600.0, 4 * 3600.0)

#: The simulated clock's reading when a run starts.
START = 1000.0
_START = START


def _describe(pick: Adopted | Flight | None) -> str:
    if pick is None:
        return "planned event"
    if isinstance(pick, Flight):
        frames = pick.items[0][1]
        kind = frames[0][0] if frames and frames[0] else -1
        way = "->server" if pick.direction == 0 else "->client"
        return f"deliver {way} {pick.link.endpoint} {pick.link.peer!r} kind=0x{kind:02x}"
    return f"{pick.owner}: {pick.work.name}"


class SimDirectory:
    """Device -> endpoint, as the simulation moves servers (a ``Directory``)."""

    def __init__(self) -> None:
        self.where: dict[str, str] = {}

    def resolve(self, device: str) -> str:
        endpoint = self.where.get(device)
        if endpoint is None:
            raise NoSuchDeviceError(f"{device}: no such device in the simulation")
        return endpoint

    def devices(self) -> dict[str, str]:
        return dict(self.where)


@dataclass(slots=True, eq=False)
class SimServer:
    name: str
    endpoint: str
    devices: dict[str, SimDevice]
    owner: str = ""
    #: The writers of each policy put in force, from when: (since, writers).
    policies: list[tuple[float, frozenset[str]]] = field(default_factory=list)
    server: Server | None = None
    transport: Any = None
    lives: int = 0
    down: bool = False
    started: float = 0.0  # when its current incarnation started (monotonic, simulated)


@dataclass(slots=True, eq=False)
class SimClient:
    name: str
    service: ClientService
    subs: list[SubWatch] = field(default_factory=list)


@dataclass(slots=True)
class RunResult:
    """What one seed did."""

    seed: int
    steps: int
    simulated: float
    failure: InvariantBroken | None
    trace: list[str]
    counts: dict[str, int]
    cpu: float = 0.0  # CPU seconds of this process spent on the run (machine load aside)


class Simulation:
    """One seed's run; :meth:`run` returns its :class:`RunResult`."""

    def __init__(self, seed: int, settings: SimSettings, verbose: bool = False) -> None:
        self.seed = seed
        self.settings = settings
        self.rng = random.Random(seed)
        self.clock = SimClock(_START)
        self.driver = SimDriver()
        self.wall = SimWallClock(self.clock, self.driver)
        # Clock steps come from a stream of their own: a step draws nothing from ``rng`` and
        # is applied between steps, so every other choice of a seed is what it was without
        # them (the regression seeds keep their schedules).
        self._steps_rng = random.Random(f"clock-step:{seed}")
        self._clock_steps: list[float] = []
        # Machines a fault made silent at some point (paused, partitioned, stalled, crashed):
        # only their peers' heartbeats may time out (invariant ``heartbeat``).
        self.silenced: set[str] = set()
        self._heartbeat_timeouts: dict[str, int] = {}
        #: The clock clients keep their promises by (timeouts, heartbeats, reconnection):
        #: the monotonic one. A test gives them one that steps, to see the steps caught.
        self.client_clock: Callable[[], float] = self.clock
        self.trace = Trace(verbose=verbose)
        self.checker = Checker(self.clock)
        self.faults = settings.faults
        rng = self.rng
        if "delay" in self.faults:
            low, high = 0.0, rng.choice((0.0005, 0.005, 0.05))
        else:
            low = high = 0.0001
        self.network = SimNetwork(self.clock, lambda: rng.uniform(low, high))
        self.directory = SimDirectory()
        self._events: list[tuple[float, int, Callable[[], None], str]] = []
        self._order = itertools.count()
        self.counts: dict[str, int] = {}
        self.servers: list[SimServer] = []
        self.clients: list[SimClient] = []
        self._values = itertools.count(1)
        self._client_names = 0
        self.handler_faults = HandlerFaults(
            rng,
            0.03 if "handler-error" in self.faults else 0.0,
            0.03 if "overrun" in self.faults else 0.0,
            self.later,
        )
        self.handler_faults.late_gets = settings.late_gets
        hb_interval = rng.choice((0.25, 0.5, 1.0))
        self.config = Config(
            heartbeat_interval=hb_interval,
            heartbeat_timeout=hb_interval * rng.choice((3, 4, 6)),
            request_timeout=1.0,
            workers=rng.choice((1, 2, 4)),
            queue_limit=rng.choice((4, 100)),
            reconnect_initial=0.02,
            reconnect_max=rng.choice((0.5, 2.0)),
        )

    # --- planning ---

    def later(self, delay: float, action: Callable[[], None], what: str) -> None:
        heapq.heappush(self._events, (self.clock() + delay, next(self._order), action, what))

    def count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    # --- building ---

    def _start_server(self, s: SimServer) -> None:
        s.lives += 1
        s.owner = f"{s.name}#{s.lives}"
        net = self.network

        def factory(handler: Any, settings: Any, info: dict[str, Any]) -> Any:
            s.transport = net.server(s.endpoint, handler, settings, info)
            return s.transport

        builder = (
            ServerBuilder(s.name)
            .config(self.config)
            .transport(factory)
            .clock(self.clock)
            .immediate_updates(True)
            .directory(None)
            .policy(self._policy(s.policies[-1][1]))
            .trust_declared_principals()
        )
        if self.settings.admin:
            from rda.admin import install

            install(builder)
        for name, device in s.devices.items():
            builder.device(name, device)
        with self.driver.owning(s.owner):
            s.server = builder.build()
            s.server.start()
        s.down = False
        s.started = self.clock()
        for name in s.devices:
            self.directory.where[name] = s.endpoint

    def _build(self) -> None:
        rng = self.rng
        for i in range(rng.randint(1, self.settings.max_servers)):
            devices = {
                f"D{i}.{j}": SimDevice(self.handler_faults) for j in range(rng.randint(1, 2))
            }
            s = SimServer(f"S{i}", f"mem://S{i}", devices)
            s.policies.append((self.clock(), self._writers()))
            for name, device in devices.items():
                device.authorize = functools.partial(self._check_set, s)
                device.applied = functools.partial(self._set_applied, name)
            self.servers.append(s)
            self._start_server(s)
        for _ in range(rng.randint(2, self.settings.max_clients)):
            self._new_client()

    def _new_client(self) -> SimClient:
        net = self.network
        name = f"C{self._client_names}"
        self._client_names += 1

        def factory(handler: Any, settings: Any, info: dict[str, Any]) -> Any:
            return net.client(handler, settings, info)

        with self.driver.owning(name):
            service = ClientService(
                self.directory,
                self.config,
                transport_factory=factory,
                clock=self.client_clock,
                rng_seed=self.rng.randrange(2**32),
                principal=name,
            )
        client = SimClient(name, service)
        self.clients.append(client)
        return client

    # --- authorization (RBAC) ---

    _PRINCIPALS = tuple(f"C{i}" for i in range(12))

    def _writers(self) -> frozenset[str]:
        """Who may set, in a policy drawn now (everyone may get and subscribe)."""
        return frozenset(p for p in self._PRINCIPALS if self.rng.random() < 0.7)

    @staticmethod
    def _policy(writers: frozenset[str]) -> Policy:
        return Policy.from_dict(
            {
                "roles": ["reader", "writer"],
                "principals": {
                    p: ["reader", "writer"] if p in writers else ["reader"]
                    for p in Simulation._PRINCIPALS
                },
                "rules": [
                    {"role": "writer", "operation": "set", "effect": "allow"},
                    {"role": "reader", "operation": "get", "effect": "allow"},
                    {"role": "reader", "operation": "subscribe", "effect": "allow"},
                    {"role": "reader", "operation": "admin:*", "effect": "allow"},
                ],
            },
            source="simulation",
        )

    def _check_set(self, s: SimServer, request: Any) -> None:
        """A set handler runs: some policy in force since the request arrived must allow it."""
        principal = request.client.principal
        arrived = request.received_at
        history = s.policies
        allowed = False
        for i, (_, writers) in enumerate(history):
            until = history[i + 1][0] if i + 1 < len(history) else float("inf")
            if until >= arrived and principal in writers:
                allowed = True
                break
        if not allowed:
            self.checker.broken(
                "rbac",
                f"{principal} set {request.device}/{request.property} on {s.name} (arrived at "
                f"{arrived:.6f}), which no policy in force since allowed",
            )

    def _set_applied(self, device: str, request: Any, value: int) -> None:
        sent = self.network.sets_sent.get((request.client.peer, request.message.header.id))
        self.checker.set_applied((device, "Setting"), value, sent)

    def _fault_policy_reload(self) -> None:
        s = self.rng.choice(self.servers)
        writers = self._writers()
        s.policies.append((self.clock(), writers))
        if not s.down and s.server is not None:
            with self.driver.owning(s.owner):
                s.server.set_policy(self._policy(writers))
        self.count("policy-reloads")
        self.trace.add(self.clock(), "POLICY", f"{s.name}: writers {sorted(writers)}")

    def _fault_churn(self) -> None:
        """A client process ends (closing its service) and another one starts."""
        if len(self.clients) > 1:
            client = self.rng.choice(self.clients)
            if client.name not in self.driver.paused:
                for watch in client.subs:
                    watch.closed = True
                self._count_heartbeat_timeouts(client)
                with self.driver.owning(client.name):
                    client.service.close()
                self.clients.remove(client)
                self.trace.add(self.clock(), "CLOSE", client.name)
        if self._client_names < len(self._PRINCIPALS):
            client = self._new_client()
            self.count("churn")
            self.trace.add(self.clock(), "NEW", client.name)

    # --- workload (user actions) ---

    def _devices(self) -> list[tuple[SimServer, str, SimDevice]]:
        return [(s, n, d) for s in self.servers for n, d in s.devices.items()]

    def _act(self) -> None:
        """One user action, then the next one planned."""
        rng = self.rng
        roll = rng.random()
        if roll < 0.35:
            self._publish()
        else:
            client = rng.choice(self.clients)
            if client.name not in self.driver.paused:
                with self.driver.owning(client.name):
                    try:
                        # Drawn only when admin commands are in the workload (SimSettings).
                        if self.settings.admin and rng.random() < 0.05:
                            self._admin(client)
                        elif roll < 0.5:
                            if sum(not w.closed for w in client.subs) < 6:
                                self._subscribe(client)
                        elif roll < 0.58:
                            self._unsubscribe(client)
                        elif roll < 0.85:
                            self._get(client)
                        else:
                            self._set(client)
                    except NoSuchDeviceError as exc:
                        # Its server's directory entries expired: the user is told at once.
                        self.count("unresolved")
                        self.trace.add(self.clock(), "refused", str(exc))
        if self.clock() < self._workload_end:
            self.later(rng.expovariate(self._rate), self._act, "user action")

    def _publish(self) -> None:
        server, name, device = self.rng.choice(self._devices())
        if server.down or server.owner in self.driver.paused:
            return
        device.k += 1
        with self.driver.owning(server.owner):
            device.publish("Acq", Data(k=device.k))
        self.count("published")
        self.trace.add(self.clock(), "publish", f"{name}/Acq k={device.k}")

    def _subscribe(self, client: SimClient) -> None:
        rng = self.rng
        _, name, _ = rng.choice(self._devices())
        selector = rng.choice(("", "", "sel.A"))
        filters = rng.choice((None, None, {"f": 1}))
        queue_size = rng.choice((1000, 1000, 3))
        watch = SubWatch(
            self.checker,
            f"{client.name}:sub{len(client.subs)}:{name}/Acq",
            client.name,
            (name, "Acq"),
        )
        ap = client.service.access_point(name, "Acq")
        watch.subscription = ap.subscribe(
            selector or None, filters, listener=watch.listener, queue_size=queue_size
        )
        client.subs.append(watch)
        self.checker.subs.append(watch)
        self.count("subscribed")
        self.trace.add(self.clock(), "subscribe", f"{watch.label} sel={selector!r} q={queue_size}")

    def _unsubscribe(self, client: SimClient) -> None:
        open_subs = [w for w in client.subs if not w.closed]
        if not open_subs:
            return
        watch = self.rng.choice(open_subs)
        watch.subscription.close()
        watch.closed = True
        self.count("unsubscribed")
        self.trace.add(self.clock(), "unsub", watch.label)

    def _get(self, client: SimClient) -> None:
        rng = self.rng
        _, name, _ = rng.choice(self._devices())
        prop = rng.choice(("Acq", "Setting"))
        timeout = rng.choice((0.2, 1.0, 3.0))
        watch = RequestWatch(f"{client.name}:get {name}/{prop}", client.name, self.clock(), timeout)
        if prop == "Setting":
            watch.get_key = (name, prop)
        future = client.service.access_point(name, prop).get_async(timeout=timeout)
        self.checker.request(watch, future)
        self.count("gets")
        self.trace.add(self.clock(), "get", f"{watch.label} timeout={timeout}")

    def _set(self, client: SimClient) -> None:
        rng = self.rng
        _, name, _ = rng.choice(self._devices())
        timeout = rng.choice((0.2, 1.0, 3.0))
        value = next(self._values)
        watch = RequestWatch(
            f"{client.name}:set {name}/Setting v={value}", client.name, self.clock(), timeout
        )
        watch.set_key, watch.set_value = (name, "Setting"), value
        future = client.service.access_point(name, "Setting").set_async(
            {"v": value}, timeout=timeout
        )
        self.checker.request(watch, future)
        self.count("sets")
        self.trace.add(self.clock(), "set", f"{watch.label} timeout={timeout}")

    def _admin(self, client: SimClient) -> None:
        """An admin command to a server, as ``rda admin`` sends it (over the same client)."""
        rng = self.rng
        s = rng.choice(self.servers)
        command = rng.choice(("info", "clients", "subscriptions"))
        timeout = rng.choice((0.2, 1.0, 3.0))
        watch = AdminWatch(
            f"{client.name}:admin {command} {s.name}", client.name, self.clock(), timeout
        )
        watch.command, watch.server, watch.lives, watch.started = command, s, s.lives, s.started
        future = client.service.admin_async(s.endpoint, command, timeout=timeout)
        self.checker.request(watch, future)
        self.count("admin")
        self.trace.add(self.clock(), "admin", f"{watch.label} timeout={timeout}")

    # --- faults ---

    def _fault(self) -> None:
        rng = self.rng
        kinds = sorted(self.faults - _BACKGROUND)
        if kinds and self.clock() < self._workload_end:
            kind = rng.choice(kinds)
            getattr(self, "_fault_" + kind.replace("-", "_"))()
            self.later(rng.expovariate(self._fault_rate), self._fault, "fault")

    def _fault_reset(self) -> None:
        links = self.network.live_links()
        if links:
            link = self.rng.choice(links)
            self.network.reset(link)
            self.count("resets")
            self.trace.add(self.clock(), "RESET", f"{link.endpoint} {link.peer!r}")

    def _fault_partition(self) -> None:
        s = self.rng.choice(self.servers)
        if s.endpoint in self.network.sim_partitioned:
            return
        self.network.partition(s.endpoint)
        self.silenced.add(s.name)
        span = self.rng.uniform(0.1, 3.0) * self.config.heartbeat_timeout
        self.count("partitions")
        self.trace.add(self.clock(), "PARTITION", f"{s.endpoint} for {span:.3f}")
        self.later(span, lambda: self._heal(s), "heal")

    def _heal(self, s: SimServer) -> None:
        self.network.heal(s.endpoint)
        self.trace.add(self.clock(), "HEAL", s.endpoint)

    def _fault_stall(self) -> None:
        links = [
            link for link in self.network.live_links() if link.peer not in self.network.sim_stalled
        ]
        if not links:
            return
        link = self.rng.choice(links)
        self.network.stall_client(link.peer)
        self.silenced.add("stalled-client")  # which client's pipe: the peer id does not say
        span = self.rng.uniform(0.01, 2.0)
        self.count("stalls")
        self.trace.add(self.clock(), "STALL", f"{link.peer!r} for {span:.3f}")
        self.later(span, lambda: self.network.unstall_client(link.peer), "unstall")

    def _fault_pause(self) -> None:
        owners = [c.name for c in self.clients] + [s.owner for s in self.servers if not s.down]
        owner = self.rng.choice(owners)
        if owner in self.driver.paused:
            return
        self.driver.paused.add(owner)
        self.silenced.add(SimWallClock.machine(owner))
        self.checker.pause_began(owner)
        span = self.rng.uniform(0.05, 2.0) * self.config.heartbeat_timeout
        self.count("pauses")
        self.trace.add(self.clock(), "PAUSE", f"{owner} for {span:.3f}")
        self.later(span, lambda: self._resume(owner), "resume")

    def _resume(self, owner: str) -> None:
        self.driver.paused.discard(owner)
        self.trace.add(self.clock(), "RESUME", owner)

    def _fault_crash(self) -> None:
        up = [s for s in self.servers if not s.down]
        if not up:
            return
        s = self.rng.choice(up)
        self.driver.paused.discard(s.owner)
        with self.driver.owning(s.owner):
            s.transport.kill()
        self.driver.crash(s.owner)
        self.silenced.add(s.name)
        s.down = True
        span = self.rng.uniform(0.01, 3.0)
        if self.rng.random() < 0.5:
            # Back on another endpoint: its directory entries expire meanwhile (a lease).
            s.endpoint = f"mem://{s.name}-{s.lives}"
            self.later(self.rng.uniform(0.0, span), lambda: self._expire(s), "entries expire")
        self.count("crashes")
        self.trace.add(self.clock(), "CRASH", f"{s.owner}, back at {s.endpoint} in {span:.3f}")
        self.later(span, lambda: self._restart(s), "restart")

    def _expire(self, s: SimServer) -> None:
        if s.down:
            for name in s.devices:
                self.directory.where.pop(name, None)
            self.trace.add(self.clock(), "EXPIRED", f"{s.name}'s directory entries")

    def _restart(self, s: SimServer) -> None:
        if not s.down:
            return  # already restarted (the faults ended)
        self._start_server(s)
        self.trace.add(self.clock(), "RESTART", s.owner)

    def _fault_slow_consumer(self) -> None:
        client = self.rng.choice(self.clients)
        parts = [
            p for p in self.driver.parts if p.owner == client.name and "listener" in p.work.name
        ]
        if not parts:
            return
        key = f"{client.name}/listeners"
        if key in self.driver.paused:
            return
        for part in parts:
            part.owner = key
        span = self.rng.uniform(0.05, 3.0)
        self.driver.paused.add(key)
        self.count("slow-consumers")
        self.trace.add(self.clock(), "SLOW", f"{client.name} listeners for {span:.3f}")
        self.later(span, lambda: self._fast_again(client.name, key), "consumer back")

    def _fast_again(self, client: str, key: str) -> None:
        self.driver.paused.discard(key)
        for part in self.driver.parts:
            if part.owner == key:
                part.owner = client
        self.trace.add(self.clock(), "FAST", client)

    # --- the loop ---

    def run(self) -> RunResult:
        rda_log = logging.getLogger("rda")
        watch = LogWatch(self.checker)
        propagate = rda_log.propagate
        rda_log.addHandler(watch)
        rda_log.propagate = False
        failure: InvariantBroken | None = None
        steps = 0
        cpu = time.process_time()
        try:
            with driven_by(self.driver), wall_clock(self.wall.seconds, self.wall.nanoseconds):
                steps = self._run()
        except InvariantBroken as exc:
            failure = exc
            steps = self._steps
        finally:
            try:
                self._close()
            finally:
                rda_log.removeHandler(watch)
                rda_log.propagate = propagate
        return RunResult(
            self.seed,
            steps,
            self.clock() - _START,
            failure,
            self.trace.lines(),
            dict(self.counts),
            time.process_time() - cpu,
        )

    def _run(self) -> int:
        rng = self.rng
        settings = self.settings
        self._steps = 0
        with self.driver.owning("sim"):
            self._build()
        start = self.clock()
        self._workload_end = start + settings.duration
        end = self._workload_end + settings.quiet
        self._rate = rng.choice((10.0, 40.0, 150.0))
        self._fault_rate = rng.choice((0.5, 2.0, 5.0))
        self.later(0.0, self._act, "user action")
        if self.faults - {"delay", "handler-error", "overrun"}:
            self.later(rng.expovariate(self._fault_rate), self._fault, "fault")
        if "clock-step" in self.faults:
            at, srng = start, self._steps_rng
            while True:
                at += srng.expovariate(self._fault_rate)
                if at >= self._workload_end:
                    break
                self._clock_steps.append(at)
        self.later(settings.duration, self._calm, "faults end")
        self.later(settings.duration + settings.quiet * 0.8, self._last_publish, "last publish")
        driver, network, checker, clock = self.driver, self.network, self.checker, self.clock
        events = self._events
        verbose = self.trace.verbose
        clock_steps = self._clock_steps
        while True:
            now = clock()
            while clock_steps and clock_steps[0] <= now:
                clock_steps.pop(0)
                self._step_a_wall_clock()
            self._steps += 1
            if self._steps > settings.max_steps:
                checker.broken("progress", f"{settings.max_steps} steps without the run ending")
                checker.check()
            ready: list[Adopted | Flight | None] = list(driver.ready())
            ready.extend(network.due(now))
            if events and events[0][0] <= now:
                ready.append(None)
            if not ready:
                candidates = [
                    t for t in (driver.next_deadline(), network.next_deadline()) if t is not None
                ]
                if events:
                    candidates.append(events[0][0])
                nxt = min(candidates) if candidates else None
                if nxt is None or nxt > end:
                    break
                clock.set(max(nxt, now))
                continue
            pick = ready[rng.randrange(len(ready))]
            if verbose:
                self.trace.add(now, "step", _describe(pick))
            if pick is None:
                _, _, action, _ = heapq.heappop(events)
                action()
            elif isinstance(pick, Flight):
                network.deliver(pick)
            else:
                driver.step(pick)
            checker.check()
        self._finish()
        return self._steps

    def _step_a_wall_clock(self) -> None:
        """Fault ``clock-step``: one machine's wall clock jumps; its monotonic clock does not.

        Drawn from the clock steps' own stream (see ``__init__``)."""
        srng = self._steps_rng
        machines = [s.name for s in self.servers] + [c.name for c in self.clients]
        machine = srng.choice(machines)
        seconds = srng.choice(_CLOCK_STEPS) * srng.choice((-1.0, 1.0)) * srng.uniform(0.5, 1.5)
        self.wall.step(machine, seconds)
        self.count("clock-steps")
        self.trace.add(self.clock(), "CLOCK", f"{machine}'s wall clock {seconds:+.3f} s")

    def _calm(self) -> None:
        """The faults stop: heal, unstall, resume; crashed servers come back."""
        for endpoint in list(self.network.sim_partitioned):
            self.network.heal(endpoint)
        for peer in list(self.network.sim_stalled):
            self.network.unstall_client(peer)
        for owner in list(self.driver.paused):
            if owner.endswith("/listeners"):
                self._fast_again(owner.split("/")[0], owner)
            else:
                self._resume(owner)
        for s in self.servers:
            if s.down:
                self._restart(s)
        self.trace.add(self.clock(), "CALM", "faults over")

    def _last_publish(self) -> None:
        for _, name, device in self._devices():
            device.k += 1
            server = next(s for s in self.servers if name in s.devices)
            with self.driver.owning(server.owner):
                device.publish("Acq", Data(k=device.k))
        self.trace.add(self.clock(), "LAST", "a last value on every device")

    def _finish(self) -> None:
        """Progress: every request ended; every open subscription has the last value."""
        checker = self.checker
        for watch in checker.unfinished():
            checker.broken("exactly-once", f"{watch.label} never ended")
        devices = {name: d for _, name, d in self._devices()}
        for sub in checker.subs:
            if sub.closed:
                continue
            if sub.subscription.closed:
                # Ended by rda (refused, overloaded): only with an error its user saw.
                if not sub.errors:
                    checker.broken("progress", f"{sub.label} ended without an error")
                elif sub.last_error in ("OverloadError", "TimeoutError"):
                    # A busy or paused server turned its SUBSCRIBE away for now: no refusal.
                    checker.broken(
                        "progress", f"{sub.label} ended by rda on a passing {sub.last_error}"
                    )
                continue
            device = devices[sub.key[0]]
            if sub.last_k != device.k:
                checker.broken(
                    "progress",
                    f"{sub.label}: with the faults over, its last value is k={sub.last_k} "
                    f"(epoch {'open' if sub.epoch else 'closed'}), the device published "
                    f"k={device.k}",
                )
        self._bounded()
        self._heartbeats()
        checker.check()

    def _count_heartbeat_timeouts(self, client: SimClient) -> None:
        """A client's transport's heartbeat timeouts, kept when it closes (churn)."""
        timeouts = client.service.statistics().transport.heartbeat_timeouts
        if timeouts:
            self._heartbeat_timeouts[client.name] = timeouts

    def _heartbeats(self) -> None:
        """Heartbeat: a connection is dropped as silent only when a fault silenced one of its
        ends (a pause, a partition, a stalled pipe, a crash). A step of the wall clock, or
        any other fault, must not stall a heartbeat or make a live peer look silent."""
        for client in self.clients:
            self._count_heartbeat_timeouts(client)
        servers = {s.name for s in self.servers}
        silenced = self.silenced
        any_server = bool(silenced & servers) or "stalled-client" in silenced
        any_client = bool(silenced - servers)
        for name, timeouts in sorted(self._heartbeat_timeouts.items()):
            if name not in silenced and not any_server:
                self.checker.broken(
                    "heartbeat",
                    f"{name}: {timeouts} heartbeat timeout(s), but no fault silenced it or "
                    "any server",
                )
        for s in self.servers:
            if s.server is None or s.down:
                continue
            timeouts = s.server.statistics().transport.heartbeat_timeouts
            if timeouts and s.name not in silenced and not any_client:
                self.checker.broken(
                    "heartbeat",
                    f"{s.name}: {timeouts} heartbeat timeout(s), but no fault silenced it or "
                    "any client",
                )

    def _bounded(self) -> None:
        """Bounded: with the faults over, nothing is left behind in the tables: no request
        pending in a client, and each server holds exactly the subscriptions its live
        clients keep open (a departed client's, or a closed one's, are gone)."""
        checker = self.checker
        open_at: dict[str, int] = {s.name: 0 for s in self.servers}
        server_of = {name: s.name for s, name, _ in self._devices()}
        for client in self.clients:
            stats = client.service.statistics()
            if stats.pending:
                checker.broken("bounded", f"{client.name}: {stats.pending} request(s) pending")
            live = [w for w in client.subs if not w.closed and not w.subscription.closed]
            if stats.subscriptions != len(live):
                checker.broken(
                    "bounded",
                    f"{client.name}: {stats.subscriptions} subscriptions in the client, "
                    f"{len(live)} open",
                )
            for w in live:
                open_at[server_of[w.key[0]]] += 1
        for s in self.servers:
            if s.server is None or s.down:
                continue
            held = s.server.statistics().subscriptions
            if held != open_at[s.name]:
                checker.broken(
                    "bounded",
                    f"{s.name} holds {held} subscriptions, its clients keep {open_at[s.name]} open",
                )

    def _close(self) -> None:
        with driven_by(self.driver):
            for client in self.clients:
                with self.driver.owning(client.name):
                    client.service.close()
            for s in self.servers:
                if s.server is not None and not s.down:
                    with self.driver.owning(s.owner):
                        s.server.stop()
            self.network.close()
