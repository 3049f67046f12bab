"""The status facts: what a client may do with a status is read from the error map."""

from __future__ import annotations

from dcpkv.core.status import ERROR_MAP, ErrorAttribute, Status, refreshes_map, retryable


def test_retryable_statuses_are_the_temporary_ones_and_not_my_vbucket() -> None:
    assert {s for s in Status if retryable(s)} == {
        Status.NotMyVbucket,
        Status.Etmpfail,
        Status.Ebusy,
        Status.Enomem,
        Status.SyncWriteInProgress,  # a prepare pending on the key: it ends, one way or another
        Status.SyncWriteReCommitInProgress,
    }


def test_a_status_that_invalidates_the_connection_is_not_retried_on_it() -> None:
    assert ErrorAttribute.RETRY_LATER in ERROR_MAP[Status.NotInitialized].attrs
    assert not retryable(Status.NotInitialized)


def test_only_not_my_vbucket_refreshes_the_cluster_map() -> None:
    assert {s for s in Status if refreshes_map(s)} == {Status.NotMyVbucket}


def test_plain_ints_and_unlisted_statuses_are_read_too() -> None:
    assert retryable(0x86) and not retryable(0x09) and not retryable(0xFFFF)
