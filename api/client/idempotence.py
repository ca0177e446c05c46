"""The idempotent producer's bookkeeping: producer id, epoch, sequences.

Pure: no I/O, no clock. The ``Sender`` asks it before a batch leaves and
tells it how each request ended; the accumulator asks ``may_send`` while it
drains. The rules follow Kafka's Java client (``TransactionManager``):

- Each partition numbers its records: a batch carries the sequence of its
  first record, assigned when it first leaves and kept across retries, so
  the leader recognises a retry of a batch it already appended and answers
  with the original offsets instead of writing it again.
- Up to ``max_in_flight`` (at most 5, the batches a broker remembers per
  producer) requests per partition are in flight at once, all to one
  broker, and only once the partition has had an answer in this epoch (so
  its leader knows the producer and checks the sequence of every later
  batch). A failed batch is retried alone, in sequence order, after every
  request of its partition has come back: nothing overtakes it.
- When a sequence can no longer be resolved (a batch that may or may not
  be in the log expired or failed for good, or the broker reports a gap
  after the last acknowledged batch), the producer waits for its requests
  to come back, then bumps its epoch (KIP-360): every partition restarts at
  sequence 0 in the new epoch, and queued batches are re-sequenced. A
  producer that used its last epoch asks the cluster for a new id.
"""

from __future__ import annotations

import dataclasses

from storage.batch import SEQUENCE_MAX, next_sequence

EPOCH_MAX = 2**15 - 1
#: The most requests per partition a broker can deduplicate (Kafka's 5).
MAX_IN_FLIGHT_IDEMPOTENT = 5

TP = tuple[str, int]
#: Errors about the producer's sequence or epoch: retried by an idempotent
#: producer (after bumping its epoch when the sequence cannot be resolved).
SEQUENCE_CODES = frozenset({"OUT_OF_ORDER_SEQUENCE_NUMBER", "UNKNOWN_PRODUCER_ID",
                            "INVALID_PRODUCER_EPOCH"})


@dataclasses.dataclass
class _Partition:
    next_seq: int = 0
    last_acked_seq: int = -1
    in_flight: int = 0
    url: str | None = None
    #: The leader has answered a request of this epoch for this partition.
    answered: bool = False


class IdempotenceState:
    """Producer id, epoch and per-partition sequences of one producer."""

    def __init__(self, max_in_flight: int) -> None:
        if not 1 <= max_in_flight <= MAX_IN_FLIGHT_IDEMPOTENT:
            raise ValueError(f"max_in_flight must be 1..{MAX_IN_FLIGHT_IDEMPOTENT} with "
                             "idempotence on")
        self.max_in_flight = max_in_flight
        self.producer_id = -1
        self.epoch = -1
        self._partitions: dict[TP, _Partition] = {}
        self._requests_in_flight = 0
        #: A sequence could not be resolved: bump the epoch once nothing is
        #: in flight.
        self.bump_needed = False
        self.bumps = 0
        #: A transactional producer's: the partitions added to its open
        #: transaction, the only ones it may send to (None: any). Its epoch
        #: is the coordinator's to bump, never its own.
        self.allowed: set[TP] | None = None

    # -- identity -------------------------------------------------------------------
    @property
    def has_id(self) -> bool:
        return self.producer_id >= 0

    @property
    def needs_new_id(self) -> bool:
        """No id yet, or the epoch to bump to would overflow."""
        if self.allowed is not None:
            return False  # the transaction manager takes the id
        return not self.has_id or (self.bump_needed and self.epoch >= EPOCH_MAX)

    def set_id(self, producer_id: int, epoch: int) -> None:
        self.producer_id, self.epoch = producer_id, epoch
        self._reset_sequences()
        self.bump_needed = False

    def maybe_bump(self) -> bool:
        """Bump the epoch if one is needed and nothing is in flight (a new
        id is needed instead past the last epoch). True if it bumped."""
        if (not self.bump_needed or self._requests_in_flight or self.epoch >= EPOCH_MAX
                or self.allowed is not None):
            return False
        self.epoch += 1
        self.bumps += 1
        self._reset_sequences()
        self.bump_needed = False
        return True

    def _reset_sequences(self) -> None:
        # Requests of the old epoch still out keep counting (their partition
        # must not pipeline to another broker meanwhile).
        self._partitions = {tp: _Partition(in_flight=p.in_flight, url=p.url)
                            for tp, p in self._partitions.items() if p.in_flight}

    # -- while draining (under the accumulator's lock) ---------------------------
    def may_send(self, tp: TP, url: str, is_retry: bool) -> bool:
        """Whether the head batch of ``tp`` may leave for ``url`` now."""
        if not self.has_id or self.bump_needed:
            return False
        if self.allowed is not None and tp not in self.allowed:
            return False
        part = self._partitions.get(tp)
        if part is None or part.in_flight == 0:
            return True
        return (not is_retry and part.url == url and part.answered
                and part.in_flight < self.max_in_flight)

    def stamp(self, tp: TP, record_count: int, batch_epoch: int, batch_seq: int,
              batch_producer_id: int) -> tuple[int, int, int] | None:
        """The ``(producer_id, epoch, base_sequence)`` a batch leaving now
        must carry, or None when it keeps the ones it has (a retry in the
        same epoch)."""
        if (batch_producer_id == self.producer_id and batch_epoch == self.epoch
                and batch_seq >= 0):
            return None
        part = self._partitions.setdefault(tp, _Partition())
        seq = part.next_seq
        part.next_seq = next_sequence(seq, record_count)
        return self.producer_id, self.epoch, seq

    def sending(self, tp: TP, url: str) -> None:
        part = self._partitions.setdefault(tp, _Partition())
        part.in_flight += 1
        part.url = url

    def request_started(self) -> None:
        self._requests_in_flight += 1

    def request_ended(self) -> None:
        self._requests_in_flight -= 1

    # -- answers ----------------------------------------------------------------------
    def returned(self, tp: TP) -> None:
        """A request carrying a batch of ``tp`` is over, however it ended."""
        part = self._partitions.get(tp)
        if part is not None and part.in_flight:
            part.in_flight -= 1

    def acked(self, tp: TP, epoch: int, base_seq: int, record_count: int) -> None:
        part = self._partitions.get(tp)
        if part is None or epoch != self.epoch:
            return
        part.answered = True
        last = next_sequence(base_seq, record_count - 1)
        if part.last_acked_seq < 0 or _after(last, part.last_acked_seq):
            part.last_acked_seq = last

    def failed(self, tp: TP, epoch: int, base_seq: int, code: str) -> bool:
        """A batch of ``tp`` came back with error ``code``; it is retried
        (the caller's limits permitting), after an epoch bump if the
        sequence cannot be resolved otherwise. True when it cannot (a real
        gap: the epoch must be bumped); False for an out-of-order arrival
        (requests in flight on separate connections can overtake each
        other) that a retry in order resolves."""
        part = self._partitions.get(tp)
        if part is None or epoch != self.epoch:
            return False  # sent in an older epoch: re-sequenced in this one
        # Until the (maybe new) leader answers again, send one at a time.
        part.answered = False
        if code == "OUT_OF_ORDER_SEQUENCE_NUMBER":
            if base_seq == next_sequence(part.last_acked_seq) or part.last_acked_seq < 0:
                # The next batch after everything acknowledged is refused:
                # the leader lost this producer's state, the gap is real.
                self.bump_needed = True
                return True
            return False  # an earlier batch is on its way or retried: wait for it
        if code in ("UNKNOWN_PRODUCER_ID", "INVALID_PRODUCER_EPOCH"):
            self.bump_needed = True
            return True
        return False

    def given_up(self, tp: TP, epoch: int, had_sequence: bool) -> None:
        """A batch that had left (``had_sequence``) failed for good or
        expired: whether it is in the log is unknown, and the sequences
        after it cannot be trusted."""
        if had_sequence and epoch == self.epoch:
            self.bump_needed = True


def _after(seq: int, other: int) -> bool:
    """Whether ``seq`` comes after ``other`` in wrapping sequence order."""
    return 0 < (seq - other) % (SEQUENCE_MAX + 1) < (SEQUENCE_MAX + 1) // 2
