"""A simulated GPU for the tier tests: streams whose work runs later, events that complete later.

:class:`SimDevice` has the five calls of :class:`dasc_runtime.demotion.CudaStreams`, so the real
``SideStream.run``, ``order_after`` and ``DemotionEngine`` drive it unchanged. Work issued on a
stream (``SimDevice.launch``: the pool's stores and loads, SGLang's ``MambaPool.copy_from``, the
simulation's model writes) is queued, not run; the test advances the device a few entries at a time
(:meth:`SimDevice.progress`, random choice among every runnable entry) or until something holds
(:meth:`SimDevice.run_until`). Semantics, those of CUDA streams:

* the main (schedule) stream runs its queue in order;
* a side stream created by :meth:`SimDevice.new_stream` runs its work in **any** order, except that
  nothing passes a ``wait_event`` / ``wait_stream`` whose event has not completed, and an event
  recorded on it completes only once the work issued since the stream's previous record has run.
  Demotion packs (one ``SideStream.run`` each: wait, pack, record) therefore complete in random
  order, later than the host launched them: a stronger adversary than one in-order CUDA stream,
  so a test passing here does not rely on the side stream's order;
* ``event.synchronize()`` runs the device until the event has completed (the host blocks);
  ``event.query()`` never runs anything.

A host read of device memory is valid only after :meth:`SimDevice.drain` (everything) or
:meth:`SimDevice.drain_main` (what the schedule stream would see).
"""

from __future__ import annotations

import contextlib
import random
from typing import Callable


class SimEvent:
    """``torch.cuda.Event`` of the simulated device (``record`` / ``query`` / ``synchronize``)."""

    def __init__(self, device: "SimDevice") -> None:
        self.device = device
        self.done = False
        self.waited = 0             # synchronize() calls (the host blocked on it)
        self.stream = None

    def record(self, stream: "SimStream") -> None:
        self.stream = stream
        stream.push("record", self)

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.waited += 1
        self.device.run_until(lambda: self.done, "event.synchronize()")


class SimStream:
    """One stream's queue of ``(kind, payload)`` entries: ``op`` (a callable), ``wait`` (an event), ``record``."""

    def __init__(self, device: "SimDevice", name: str, ordered: bool) -> None:
        self.device, self.name, self.ordered = device, name, ordered
        self.queue: list = []

    def push(self, kind: str, payload) -> None:
        self.queue.append((kind, payload))

    def wait_stream(self, other: "SimStream") -> None:
        ev = SimEvent(self.device)
        ev.record(other)
        self.wait_event(ev)

    def wait_event(self, ev: SimEvent) -> None:
        self.push("wait", ev)

    def runnable(self) -> list[int]:
        """Indices of the entries that may run now (see module docstring).

        In order: only the head (a wait once its event completed). Out of order: anything before
        the first wait whose event has not completed, an event record only once the entries issued
        since the previous record (its own pack) have run.
        """
        if self.ordered:
            if not self.queue:
                return []
            kind, x = self.queue[0]
            return [] if kind == "wait" and not x.done else [0]
        out, own_work = [], False
        for i, (kind, x) in enumerate(self.queue):
            if kind == "wait":
                if not x.done:
                    break
                out.append(i)
                own_work = True
            elif kind == "record":
                if not own_work:
                    out.append(i)
                own_work = False
            else:
                out.append(i)
                own_work = True
        return out

    def run(self, i: int) -> None:
        kind, x = self.queue.pop(i)
        if kind == "op":
            x()
        elif kind == "record":
            x.done = True


class SimDevice:
    """The simulated device (see module docstring); ``rng`` picks what runs next.

    Attributes:
        main: the schedule stream (current by default). side_events: events recorded on side
            streams, in launch order. ran: entries run so far.
    """

    enabled = True

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.main = SimStream(self, "main", ordered=True)
        self.streams = [self.main]
        self.cur = self.main
        self.side_events: list[SimEvent] = []
        self.ran = 0

    # ---- the CudaStreams interface (dasc_runtime.demotion)
    def new_stream(self) -> SimStream:
        s = SimStream(self, f"side{len(self.streams)}", ordered=False)
        self.streams.append(s)
        return s

    def current_stream(self) -> SimStream:
        return self.cur

    @contextlib.contextmanager
    def stream(self, s: SimStream):
        prev, self.cur = self.cur, s
        try:
            yield
        finally:
            self.cur = prev

    def new_event(self) -> SimEvent:
        ev = SimEvent(self)
        if self.cur is not self.main:
            self.side_events.append(ev)
        return ev

    def is_event(self, event) -> bool:
        return isinstance(event, SimEvent)

    # ---- issuing and running device work
    def launch(self, fn: Callable[[], None]) -> None:
        """Queue ``fn`` on the current stream."""
        self.cur.push("op", fn)

    def pending(self) -> int:
        return sum(len(s.queue) for s in self.streams)

    def step(self) -> bool:
        """Run one runnable entry (random stream, random entry); False when none can run."""
        choices = [(s, i) for s in self.streams for i in s.runnable()]
        if not choices:
            return False
        s, i = choices[self.rng.randrange(len(choices))]
        s.run(i)
        self.ran += 1
        return True

    def progress(self, n: int) -> None:
        for _ in range(n):
            if not self.step():
                return

    def run_until(self, pred: Callable[[], bool], what: str = "") -> None:
        while not pred():
            if not self.step():
                heads = {s.name: [k for k, _ in s.queue[:3]] for s in self.streams if s.queue}
                raise AssertionError(f"simulated device deadlock waiting for {what}: queues {heads}")

    def complete(self, ev: SimEvent) -> None:
        """Run the device until ``ev`` has completed (without counting a host wait)."""
        self.run_until(lambda: ev.done, "an event")

    def drain(self) -> None:
        """Run everything queued on every stream."""
        self.run_until(lambda: self.pending() == 0, "every stream to drain")

    def drain_main(self) -> None:
        """Run the schedule stream's queue to its end, and on side streams only what it waits for
        (other packs may stay pending: a host read after this sees what the schedule stream sees)."""
        while self.main.queue:
            if self.main.runnable():
                self.main.run(0)
                self.ran += 1
                continue
            ev = self.main.queue[0][1]                      # a wait on a side-stream event
            while not ev.done:
                choices = ev.stream.runnable() if ev.stream is not None else []
                if not choices:
                    raise AssertionError(f"simulated device deadlock: the schedule stream waits on an event of "
                                         f"{getattr(ev.stream, 'name', '?')} that cannot complete")
                ev.stream.run(choices[self.rng.randrange(len(choices))])
                self.ran += 1


class StreamedOps:
    """The pool's store / load ops, issued on the simulated device's current stream instead of run.

    Everything else (``pack_units``, ``quantize``, ``name``, ...) is the wrapped ops' own.
    """

    def __init__(self, ops, device: SimDevice) -> None:
        self._ops, self._device = ops, device

    def store(self, layout, cache, src_slots, rows, ckpt) -> None:
        src, rows = src_slots.clone(), rows.clone()
        self._device.launch(lambda: self._ops.store(layout, cache, src, rows, ckpt))

    def load(self, layout, cache, rows, dst_slots, ckpt) -> None:
        rows, dst = rows.clone(), dst_slots.clone()
        self._device.launch(lambda: self._ops.load(layout, cache, rows, dst, ckpt))

    def __getattr__(self, name):
        return getattr(self._ops, name)


def stream_copy_from(mamba_pool, device: SimDevice) -> None:
    """Make SGLang's ``MambaPool.copy_from`` (dense hits, copy-on-write donates) a launch on ``device``."""
    original = mamba_pool.copy_from

    def copy_from(src, dst):
        s, d = src.clone(), dst.clone()
        device.launch(lambda: original(s, d))

    mamba_pool.copy_from = copy_from
