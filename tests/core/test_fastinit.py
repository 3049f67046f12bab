"""fast_init: the same frozen dataclass, built faster."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest

from dcpkv.client import events
from dcpkv.client.offsets import OffsetError, VbucketOffset
from dcpkv.core.fastinit import fast_init


@fast_init
@dataclass(frozen=True, slots=True)
class Point:
    x: int
    y: int = 7


def test_positional_keyword_and_default_arguments() -> None:
    assert Point(1, 2) == Point(x=1, y=2) == Point(y=2, x=1)
    assert Point(1).y == 7
    with pytest.raises(TypeError):
        Point()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Point(1, 2, 3)  # type: ignore[call-arg]


def test_still_frozen_hashable_and_comparable() -> None:
    p = Point(1, 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.x = 3  # type: ignore[misc]
    assert hash(p) == hash(Point(1, 2))
    assert p != Point(1, 3)
    assert repr(p) == "Point(x=1, y=2)"


def test_post_init_still_checks() -> None:
    with pytest.raises(OffsetError):
        VbucketOffset(0, 5, 6, 7)  # seqno below its snapshot
    assert VbucketOffset(1, 2, 1, 3).complete is False


def test_the_events_are_built_with_it() -> None:
    o = VbucketOffset.at(3, 9)
    m = events.Mutation(1, b"k", b"v", 3, 1, 0, 0, 5, 0, o)
    assert dataclasses.astuple(m) == (1, b"k", b"v", 3, 1, 0, 0, 5, 0, dataclasses.astuple(o))
    assert events.Deletion(1, b"k", 3, 1, 5, o).delete_time == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.value = b"w"  # type: ignore[misc]


def test_refuses_what_it_cannot_build() -> None:
    @dataclass(frozen=True)
    class NoSlots:
        x: int

    with pytest.raises(TypeError, match="slotted"):
        fast_init(NoSlots)

    @dataclass(frozen=True, slots=True)
    class Factory:
        x: list[int] = field(default_factory=list)

    with pytest.raises(TypeError, match="plain fields"):
        fast_init(Factory)
