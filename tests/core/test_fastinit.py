"""fast_init: the same frozen dataclass, built faster."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest

from dcpkv.client import events
from dcpkv.client.offsets import OffsetError, VbucketOffset
from dcpkv.core.fastinit import fast_builder, fast_init


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


def test_the_instance_leaves_init_as_the_frozen_class() -> None:
    # __init__ goes through the mutable twin and back: no instance may stay a twin
    p = Point(1, 2)
    assert type(p) is Point and isinstance(p, Point)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.y = 3  # type: ignore[misc]
    assert dataclasses.replace(p, y=5) == Point(1, 5)
    assert type(dataclasses.replace(p, y=5)) is Point


def test_fast_builder_builds_the_same_frozen_object_without_checks() -> None:
    build_point = fast_builder(Point)
    p = build_point(1, 2)
    assert type(p) is Point and p == Point(1, 2) and hash(p) == hash(Point(1, 2))
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.x = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        build_point(1)  # every field, in order: no defaults
    build_offset = fast_builder(VbucketOffset)
    assert build_offset(9, 3, 1, 4) == VbucketOffset(9, 3, 1, 4)
    # no __post_init__: the caller vouches for the fields (this one would be refused)
    assert build_offset(0, 5, 6, 7).seqno == 5
    o = VbucketOffset.at(3, 9)
    m = fast_builder(events.Mutation)(1, b"k", b"v", 3, 1, 0, 0, 5, 0, o)
    assert m == events.Mutation(1, b"k", b"v", 3, 1, 0, 0, 5, 0, o)


def test_twins_only_for_what_fast_init_built() -> None:
    @dataclass(frozen=True, slots=True)
    class Plain:
        x: int

    with pytest.raises(TypeError, match="not a fast_init class"):
        fast_builder(Plain)

    @dataclass(frozen=True, slots=True)
    class Base:
        x: int

    @dataclass(frozen=True, slots=True)
    class Derived(Base):
        y: int

    with pytest.raises(TypeError, match="based on object"):
        fast_init(Derived)
