"""Counted steps kept until they are booked, without an object per step."""
import struct
from typing import Optional

import numpy as np

#: A row's fields, in order. ``compute`` is NaN where not known (the first
#: step after a start), ``start`` is NaN for a step without a worker
#: record; integers (``samples``, ``worker``, ``pid``, ``index``) are
#: exact as floats.
FIELDS = ('wait', 'compute', 'requested', 'received', 'start', 'end', 'cpu',
          'samples', 'worker', 'pid', 'index')
WIDTH = len(FIELDS)
(WAIT, COMPUTE, REQUESTED, RECEIVED, START, END, CPU, SAMPLES, WORKER, PID,
 INDEX) = range(WIDTH)
NAN = float('nan')


def worker_times(rows: np.ndarray) -> np.ndarray:
    """Per row (the last axis of ``rows``), its batch's worker time."""
    return rows[..., END] - rows[..., START]


def transfer_times(rows: np.ndarray) -> np.ndarray:
    """Per row (the last axis of ``rows``), its batch's transfer time:
    the batch was ready at max(requested, end), and arrived then."""
    return rows[..., RECEIVED] - np.maximum(rows[..., REQUESTED],
                                            rows[..., END])


def is_timed(record: dict) -> bool:
    # Records of older versions have no 'timed': every batch was.
    return record.get('timed', True)


class StepLog:
    """Counted steps as rows of numbers in one flat list, their records'
    totals included; a record is kept only where it holds more (a timed
    batch's stages, a Ray data actor's node), and the training process's
    stage times only as sums.

    A step kept as a tuple with its record (a dict) was two objects the
    garbage collector tracks, held until booked (up to tens of seconds of
    steps with the books on another thread): the young generation filled
    every ~350 steps, and each collection walked them with cold caches
    (1-4 ms a collection on a virtual machine, more when they reached the
    older generations), at the cost of whatever code allocated next. A row
    adds no such object: its numbers are the step's and its record's own
    (references, not copies: cheaper than converting each into an
    ``array('d')``), and the record goes with its batch. (A Ray data
    actor's record is kept, for its node: one batch a step, large.)
    """

    __slots__ = ('values', 'records', 'trainer')

    def __init__(self) -> None:
        self.values: list = []
        #: ``(row, record)`` of the records kept.
        self.records: list = []
        #: Seconds by stage of the training process's data work.
        self.trainer: dict = {}

    def __len__(self) -> int:
        return len(self.values) // WIDTH

    def append(self,
               wait: float,
               compute: Optional[float],
               record: Optional[dict],
               requested: float,
               received: float,
               trainer: Optional[dict] = None,
               index: int = -1) -> None:
        """Add a step (the arguments of ``StatsBook.add`` and its number)."""
        if compute is None:
            compute = NAN
        if record is None:
            self.values += (wait, compute, requested, received, NAN, NAN,
                            NAN, NAN, NAN, NAN, index)
        else:
            # (is_timed inline: one call fewer per step)
            if record.get('timed', True) or 'node' in record:
                self.records.append((len(self.values) // WIDTH, record))
            self.values += (wait, compute, requested, received,
                            record['start'], record['end'], record['cpu'],
                            record['samples'], record['worker'],
                            record['pid'], index)
        if trainer:
            sums = self.trainer
            for key, seconds in trainer.items():
                sums[key] = sums.get(key, 0.0) + seconds

    def rows(self) -> np.ndarray:
        """The rows as a ``(steps, WIDTH)`` array.

        Packed by ``struct`` (each number converted by one C call) rather
        than by ``np.array`` of the list, which inspects every item's type
        and shape first: about half the booking thread's instructions per
        step went there. The same doubles either way.
        """
        values = self.values
        packed = struct.pack(f'{len(values)}d', *values)
        return np.frombuffer(packed, dtype=np.float64).reshape(-1, WIDTH)

    def part(self, first: int, last: int) -> 'StepLog':
        """Steps ``first`` to ``last`` (excluded), as a log of their own;
        the training process's sums go with the part from the first step.
        """
        part = StepLog()
        part.values = self.values[first * WIDTH:last * WIDTH]
        part.records = [(row - first, record)
                        for row, record in self.records
                        if first <= row < last]
        if first == 0:
            part.trainer = dict(self.trainer)
        return part

    def extend(self, other: 'StepLog') -> None:
        """Add ``other``'s rows and kept records after these (not its
        training process's sums: what keeps the steps of the timeline's
        next point, which does not read them)."""
        first = len(self)
        self.values += other.values
        self.records.extend(
            (first + row, record) for row, record in other.records)
