"""Item copies: the positional :meth:`Item.with_value` equals ``dataclasses.replace`` (hypothesis),
so a field added to :class:`Item` and forgotten there fails here, not in an ejected value."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from dcpkv.engine.item import Item

U64 = st.integers(min_value=0, max_value=(1 << 64) - 1)
items = st.builds(
    Item,
    key=st.binary(min_size=1, max_size=8),
    value=st.none() | st.binary(max_size=8),
    flags=st.integers(min_value=0, max_value=(1 << 32) - 1),
    expiry=st.integers(min_value=0, max_value=(1 << 32) - 1),
    cas=U64,
    rev_seqno=U64,
    by_seqno=U64,
    datatype=st.integers(min_value=0, max_value=7),
    deleted=st.booleans(),
    delete_time=st.integers(min_value=0, max_value=(1 << 32) - 1),
    expired=st.booleans(),
)


@given(items, st.none() | st.binary(max_size=8))
def test_with_value_is_replace(item: Item, value: bytes | None) -> None:
    copy = item.with_value(value)
    assert copy == dataclasses.replace(item, value=value)
    assert copy is not item


def test_with_value_names_every_field() -> None:
    # A field with a default that with_value forgot would still compare equal above when the
    # strategy drew the default; this one has every field away from its default.
    item = Item(b"k", b"v", 1, 2, 3, 4, 5, 6, True, 7, True)
    assert dataclasses.astuple(item.with_value(None)) == (
        b"k",
        None,
        1,
        2,
        3,
        4,
        5,
        6,
        True,
        7,
        True,
    )
