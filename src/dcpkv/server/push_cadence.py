"""When the server pumps a DCP connection whose vbuckets queued items: at once, or a moment
later with what else queues meanwhile.

Theory of operation
-------------------
A pump (:meth:`dcpkv.server.app.KVProtocol.pump`) has a fixed cost whatever it carries: the
event loop's turns for it, the producer's bookkeeping, one ``write`` into the consumer's
socket and the consumer's wake-up to read it. Measured on this 2-core host: ~25-30 us of loop
a pump and ~25 us of the consumer's CPU a wake-up, against ~7 us of loop per item carried. A
client doing one write at a time (send, wait for the answer, send the next: what an SDK call
does) makes one item per round trip, and its next request arrives a few microseconds after
the server has written its answer, so a pump per write put that fixed cost into every round
trip: with one consumer on all 1,024 vbuckets such a client's Sets/s fell to 0.42-0.48x.

So items that trickle in are gathered. :func:`delay` decides, when items are queued, from
when the connection was last pumped (a pump that wrote something), how many items wait, and
whether a SyncWrite's client waits on them:

====  ==============================================================  ======================
case  situation                                                       pump
====  ==============================================================  ======================
N     nothing waits (a pump since the items were queued took them:    none (and no timer)
      the ack that commits a prepare is read, the commit queued, and
      the pump after that read sends it)
S     a SyncWrite waits (its vbucket holds a prepare and the          at once
      consumer acknowledges prepares: the client's answer waits on
      this push, the replica's ack and the way back)
Q     no pump within :data:`QUIET_S` (a write after a quiet moment,   at once
      or a paced writer's next batch, goes out with no wait)
B     :data:`BATCH_ITEMS` or more items wait (a pipelined or paced    at once
      writer: the pump's cost is shared already)
T     a trickle: a few items, soon after the last pump                at the last pump +
                                                                      :data:`PUMP_GAP_S`
====  ==============================================================  ======================

Why N and S. A timer armed for nothing held every item queued while it ran: a durable
writer's next prepare, queued a moment after the pump that carried the last commit, waited
out that commit's gap (2 ms, and on a busy host the process's wake-up after it). Gathering
buys nothing for a SyncWrite: its writer sends the next write only once this one is
answered, and the answer waits for this push, so each prepare went out alone and late
anyway. A SyncWrite-free load (what the gathering is for) decides as before.

Only notifications wait (case T); every other reason to pump does not: a consumer's own
request (a stream opening, a BufferAck opening the flow-control window), a backfill batch
landing, the transport draining, and a pump that stopped on its turn's bound with more ready.
While a connection waits, further items join the wait whatever their number. One-write-at-a-
time clients thus make about one pump per gap, carrying every item queued meanwhile.

Why 2 ms and 0.5 ms. A one-at-a-time Set takes ~45-90 us here, so a 2 ms gap gathers some
20-40 items; at 1 ms uvloop's millisecond timers gather much less (a wait under half of one
is none), and 5 or 10 ms gained nothing more in Sets/s (what remains is the items' own cost)
while delaying every item of a trickle longer. A write half a millisecond or more after the
last pump is not part of such a trickle: a client that slow hides a pump in its own turn
around, and a paced writer's batches (``bench/latency.py`` sends one every millisecond, 2
writes each at 2k writes/s) are not held back. Gathered so, the writer's Sets/s with the
1,024 streams open measured 0.73-0.82x those of a server alone in interleaved runs, and the
consumer's CPU per write went from ~25 to ~2.5 us.

What it costs. An item of a trickle reaches the consumer up to ``PUMP_GAP_S`` later (uvloop's
timers count whole milliseconds: a wait under half of one is no wait, and the loop's clock
ticks in milliseconds). An item after a quiet moment or in a batch is not delayed.
"""

from __future__ import annotations

PUMP_GAP_S = 0.002
QUIET_S = 0.0005
BATCH_ITEMS = 4


def delay(last_pump: float, waiting: int, now: float, sync_write: bool = False) -> float | None:
    """Seconds to wait before pumping a connection whose vbuckets queued items (the module
    docstring's table): ``last_pump`` is when it was last pumped (``-inf``: never),
    ``waiting`` about how many items wait, ``sync_write`` whether a SyncWrite's client waits
    on them; 0.0 pumps at once, None not at all (nothing waits)."""
    if waiting <= 0:
        return None  # N
    if sync_write:
        return 0.0  # S
    if now - last_pump >= QUIET_S:
        return 0.0  # Q
    if waiting >= BATCH_ITEMS:
        return 0.0  # B
    return min(last_pump + PUMP_GAP_S - now, PUMP_GAP_S)  # T (a clock stepped back: one gap)
