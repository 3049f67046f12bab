"""Two buckets joined by DCP without sockets: a DcpProducer on one feeds a DcpConsumer on the
other through the codec's bytes, as two nodes would (the DCP tests' shared helper)."""

from __future__ import annotations

from dcpkv.dcp.consumer import DcpConsumer, RollbackOrder
from dcpkv.dcp.producer import DcpProducer
from dcpkv.engine.bucket import Bucket
from dcpkv.protocol import dcp
from dcpkv.protocol.frame import FrameParser
from dcpkv.protocol.messages import decode_message

VBS = 4


class Link:
    """Bytes both ways between a consumer and a producer, through the codec."""

    def __init__(
        self, active: Bucket, replica: Bucket, *, consumer_name: str | None = None
    ) -> None:
        self.active, self.replica = active, replica
        self.consumer = DcpConsumer(
            replica, "Replica:test", range(VBS), consumer_name=consumer_name
        )
        self.producer: DcpProducer | None = None
        self.rollbacks: list[RollbackOrder] = []
        self.now = 0.0
        # the vbuckets the replica said have an ack due (as the shell hears them)
        self.acks_due: list[int] = []
        replica.seqno_ack_listeners.append(self.acks_due.append)

    def due_acks(self) -> list[bytes]:
        """The acks due for the vbuckets the replica named since the last call (the shell's
        ``_send_acks``)."""
        due, self.acks_due[:] = set(self.acks_due), []
        return self.consumer.seqno_acks(due)

    def connect(self) -> None:
        self.producer = None
        self.to_producer(self.consumer.opening(self.now))

    def to_producer(self, chunks: list[bytes]) -> None:
        for msg in _decode(chunks):
            if isinstance(msg, dcp.DcpOpen):
                self.producer = DcpProducer(self.active, msg.name, msg.flags,
                                            clock=self.active.clock)  # fmt: skip
                continue
            assert self.producer is not None
            answer = self.producer.handle(msg)
            if answer:
                self.to_consumer([answer])

    def to_consumer(self, chunks: list[bytes]) -> None:
        parser = FrameParser()
        for chunk in chunks:
            for frame in parser.feed(chunk):
                answers, rollbacks = self.consumer.handle(decode_message(frame), frame.size,
                                                          self.now)  # fmt: skip
                self.rollbacks += rollbacks
                self.to_producer(answers)

    def pump(self) -> None:
        """Until quiet: producer output to the consumer, rollbacks done, requests sent."""
        for _ in range(100):
            assert self.producer is not None
            out = self.producer.next_messages()
            self.to_consumer(out)
            for rollback in self.rollbacks:
                self.replica.rollback(rollback.vbucket, rollback.seqno)
                self.consumer.rolled_back(rollback.vbucket)
            done_rollbacks, self.rollbacks = bool(self.rollbacks), []
            requests = self.consumer.requests(self.now)
            self.to_producer(requests)
            if not out and not done_rollbacks and not requests:
                return
        raise AssertionError("never quiet")


def _decode(chunks: list[bytes]) -> list[object]:
    parser = FrameParser()
    return [decode_message(f) for c in chunks for f in parser.feed(c)]
