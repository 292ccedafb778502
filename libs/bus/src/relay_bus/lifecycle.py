"""The lifecycle of a service whose only dependency is the bus (plus optional hooks).

Invariant: start runs `before_start` hooks, then the bus, within `startup_timeout_s`, then the
`after_start` hooks (before the service counts as started); `lame_duck` runs the `lame_duck`
hooks once, on the first SIGTERM, while the service still serves everything (`relay_runtime.serve`);
stop stops the consumers (they commit), runs the `drain` hooks while the producer still works,
stops the producer, then runs `after_stop` hooks, each at most once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from relay_bus.bus import Bus

Hook = Callable[[], Awaitable[None]]


class BusLifecycle:
    def __init__(
        self,
        bus: Bus,
        startup_timeout_s: float,
        *,
        before_start: tuple[Hook, ...] = (),
        after_start: tuple[Hook, ...] = (),
        drain: tuple[Hook, ...] = (),
        after_stop: tuple[Hook, ...] = (),
        lame_duck: tuple[Hook, ...] = (),
    ) -> None:
        self.bus = bus
        self.startup_timeout_s = startup_timeout_s
        self.before_start = before_start
        self.after_start = after_start
        self.drain = drain
        self.after_stop = after_stop
        self.lame_duck_hooks = lame_duck
        self._stopped = False

    async def start(self) -> None:
        for hook in self.before_start:
            await hook()
        await self.bus.start(self.startup_timeout_s)
        for hook in self.after_start:
            await hook()

    async def lame_duck(self) -> None:
        for hook in self.lame_duck_hooks:
            await hook()

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        await self.bus.stop(self.drain)
        for hook in self.after_stop:
            await hook()
