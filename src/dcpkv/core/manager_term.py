"""The term a manager's connection to a node speaks for, and the node's fence on it.

Theory of operation
-------------------
Several managers over etcd elect one leader (``dcpkv.cluster.leadership``); its term (the
etcd revision it won at) only grows from leader to leader. A manager names its term in the
agent of the HELLO that opens each connection to a node (:func:`agent_for`). The node keeps
the newest term any connection named (:class:`TermFence`) and refuses the commands that
change what it holds (SetVbucket, DelVbucket, SetClusterConfig) on a connection of an older
term: a deposed leader's late command cannot undo its successor's. A managed node writes the
newest term to its data folder before it answers the Hello that raised it and reads it back at
start, so a restart (even a kill -9) does not open the fence to a deposed leader that connects
again. A connection that names no term (a one-manager cluster, an operator's tool) is term 0:
refused only on a node that has seen a term. (The fence is not raised by the ``revEpoch`` of
the maps a node keeps: a one-manager cluster's maps carry ``revEpoch`` 1 and its manager
names no term.)

===============================  =============================================
agent                            term
===============================  =============================================
``dcpkv-manager term=42``        42
``dcpkv-manager``                0
``dcpkv-manager term=x``         0 (unreadable: treated as naming none)
``anything else``                0
===============================  =============================================
"""

from __future__ import annotations

from dataclasses import dataclass

AGENT = "dcpkv-manager"


def agent_for(term: int) -> str:
    return f"{AGENT} term={term}" if term > 0 else AGENT


def term_of(agent: str) -> int:
    name, _, rest = agent.partition(" ")
    key, _, value = rest.partition("=")
    if name != AGENT or key != "term" or not value.isdigit():
        return 0
    return int(value)


@dataclass
class TermFence:
    """The newest term a node has seen; which connections may still change its state."""

    newest: int = 0

    def saw(self, term: int) -> bool:
        """Note ``term``; whether it raised the fence (a newer term: the shell keeps it)."""
        if term <= self.newest:
            return False
        self.newest = term
        return True

    def allows(self, term: int) -> bool:
        return term >= self.newest
