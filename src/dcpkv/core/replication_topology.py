"""A vbucket's replication topology: the chains a SyncWrite must reach (PROTOCOL.md, "SyncWrites").

Theory of operation
-------------------
The manager tells an active vbucket who replicates it with SetVbucket and a JSON value::

    {"topology": [["active", "replica1", null], ["new_active", "new_replica"]]}

One chain normally; a second one during the last stage of a takeover (the chain the vbucket is
moving to). A chain is the active's node name then its replica slots; ``null`` is a slot with no
node. Names are the ``consumer_name`` the replicas give on their DCP connections, so a seqno
acknowledgement can be matched to a slot.

Each chain's *majority* is ``len(chain) // 2 + 1``: null slots count in the length (a bucket with
one replica configured and none placed needs two nodes) but never as acks. Durability is
possible when every chain has enough named nodes for its majority and no more replicas than the
server supports for SyncWrites (2, as the reference); otherwise a SyncWrite is refused with
DurabilityImpossible.

:func:`parse_topology` refuses a malformed value with a :class:`TopologyError` saying what is
wrong (SetVbucket answers Einval, and the vbucket keeps the topology it had):

=========================================  ================================================
value                                      error
=========================================  ================================================
not JSON, not an object, no "topology"     the value must be {"topology": [...]}
"topology" not a list, or empty            the topology must be a list of 1 or 2 chains
more than two chains                       at most two chains (a second only in a takeover)
a chain not a list, or empty               each chain is a non-empty list
a chain longer than 1 + 3 slots            more replicas than a bucket supports
a slot neither a string nor null           node names are non-empty strings (or null)
a chain's first slot null                  the chain's active is missing
a node twice in one chain                  duplicate node
the first chain's active is not this node  the topology names another active
=========================================  ================================================

A node may be in both chains (the old active is often a replica of the new chain).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from dcpkv.core.durability import MAX_REPLICAS
from dcpkv.core.errors import DcpkvError
from dcpkv.core.status import Status

# More replicas than this make a SyncWrite impossible (the reference's limit), although a
# bucket may have up to MAX_REPLICAS.
MAX_SYNC_WRITE_REPLICAS = 2
MAX_CHAINS = 2

Slot = str | None


class TopologyError(DcpkvError, ValueError):
    """A topology value of the wrong shape (the message says which rule it broke)."""

    status = Status.Einval


@dataclass(frozen=True, slots=True)
class ReplicationChain:
    """One chain: the active's name, then replica slots (``None``: no node)."""

    slots: tuple[Slot, ...]

    @property
    def active(self) -> str:
        active = self.slots[0]
        assert active is not None  # checked by parse_chain
        return active

    @property
    def majority(self) -> int:
        return len(self.slots) // 2 + 1

    @property
    def nodes(self) -> tuple[str, ...]:
        """The named nodes, the active first."""
        return tuple(slot for slot in self.slots if slot is not None)

    @property
    def durability_possible(self) -> bool:
        return self.majority <= len(self.nodes) <= 1 + MAX_SYNC_WRITE_REPLICAS


@dataclass(frozen=True, slots=True)
class ReplicationTopology:
    """The first chain and, during a takeover, the second."""

    first: ReplicationChain
    second: ReplicationChain | None = None

    @property
    def chains(self) -> tuple[ReplicationChain, ...]:
        return (self.first,) if self.second is None else (self.first, self.second)

    @property
    def nodes(self) -> frozenset[str]:
        """Every named node of every chain."""
        return frozenset(node for chain in self.chains for node in chain.nodes)

    @property
    def durability_possible(self) -> bool:
        return all(chain.durability_possible for chain in self.chains)

    def to_json(self) -> bytes:
        """The SetVbucket value the manager sends."""
        return topology_value(*(chain.slots for chain in self.chains))


def topology_value(*chains: Sequence[Slot]) -> bytes:
    """The SetVbucket JSON value for ``chains`` (the first chain, then a takeover's second)."""
    return json.dumps({"topology": [list(chain) for chain in chains]}).encode()


def parse_chain(raw: object, which: str) -> ReplicationChain:
    """One chain of a decoded topology, validated (``which`` names it in errors)."""
    if not isinstance(raw, list) or not raw:
        raise TopologyError(f"the {which} chain must be a non-empty list, not {raw!r}")
    if len(raw) > 1 + MAX_REPLICAS:
        raise TopologyError(
            f"the {which} chain has {len(raw) - 1} replica slots, more than a bucket supports "
            f"({MAX_REPLICAS})"
        )
    for slot in raw:
        if slot is not None and (not isinstance(slot, str) or not slot):
            raise TopologyError(
                f"the {which} chain's node names must be non-empty strings or null, not {slot!r}"
            )
    if raw[0] is None:
        raise TopologyError(f"the {which} chain's active (its first slot) is null")
    twice = _first_duplicate(raw)
    if twice is not None:
        raise TopologyError(f"node {twice!r} is twice in the {which} chain")
    return ReplicationChain(tuple(raw))


def _first_duplicate(slots: list[Slot]) -> str | None:
    seen: set[str] = set()
    for slot in slots:
        if slot is not None:
            if slot in seen:
                return slot
            seen.add(slot)
    return None


def topology_from_chains(raw: object, this_node: str | None = None) -> ReplicationTopology:
    """A decoded ``"topology"`` list, validated; ``this_node``, when given, must be the first
    chain's active."""
    if not isinstance(raw, list) or not raw:
        raise TopologyError(f"the topology must be a list of 1 or 2 chains, not {raw!r}")
    if len(raw) > MAX_CHAINS:
        raise TopologyError(
            f"the topology has {len(raw)} chains: at most {MAX_CHAINS} (a second one only "
            "during a takeover)"
        )
    first = parse_chain(raw[0], "first")
    second = parse_chain(raw[1], "second") if len(raw) == MAX_CHAINS else None
    if this_node is not None and first.active != this_node:
        raise TopologyError(
            f"the first chain's active is {first.active!r}, but this node is {this_node!r}"
        )
    return ReplicationTopology(first, second)


def parse_topology(value: bytes | str, this_node: str | None = None) -> ReplicationTopology:
    """The topology in a SetVbucket JSON value (the table in the module docstring)."""
    try:
        document = json.loads(value)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TopologyError(f'the value must be JSON {{"topology": [...]}}: {exc}') from None
    if not isinstance(document, dict) or "topology" not in document:
        raise TopologyError(f'the value must be a JSON object {{"topology": [...]}}: {value!r}')
    return topology_from_chains(document["topology"], this_node)
