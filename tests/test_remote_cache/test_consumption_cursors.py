"""Rank positions shared by memory-mapped files: never a torn record."""
import multiprocessing
import time

from mmdata_plugin.remote_cache.consumption_cursors import (Cursor,
                                                            CursorReader,
                                                            CursorWriter)

_FORK = multiprocessing.get_context('fork')
EPOCH_END = 1000


def test_a_record_being_written_is_not_read(tmp_path):
    writer = CursorWriter(str(tmp_path), 0, token=7)
    reader = CursorReader(str(tmp_path), [0], token=7)
    writer.publish(3, EPOCH_END)
    assert reader.read() == [Cursor(3, EPOCH_END)]
    # A writer stopped half way through the next record (the new epoch
    # stored, the count not yet): the last whole record is read.
    values = writer._values
    values[3] += 1
    values[1] = 4
    assert reader.read() == [Cursor(3, EPOCH_END)]
    values[2] = 32
    values[3] += 1
    assert reader.read() == [Cursor(4, 32)]
    writer.close()


def test_a_file_left_half_written_by_a_killed_run_is_mapped_again(tmp_path):
    killed = CursorWriter(str(tmp_path), 0, token=7)
    killed.publish(1, 64)
    killed._values[3] += 1  # killed inside publish: never whole again
    reader = CursorReader(str(tmp_path), [0], token=7)
    assert reader.read() is None
    CursorWriter(str(tmp_path), 0, token=7).publish(3, 640)  # the restart
    assert reader.read() == [Cursor(3, 640)]


def _alternate(cache_dir, stop):
    writer = CursorWriter(cache_dir, 0, token=7)
    epoch = 0
    while not stop.is_set():
        # the last batch of an even epoch, then the first of the next
        writer.publish(epoch, EPOCH_END)
        writer.publish(epoch + 1, 32)
        epoch += 2


def test_a_reader_racing_a_writer_sees_whole_records(tmp_path):
    # A torn read (a new epoch with the last epoch's count) would put the
    # node's planner a whole epoch ahead.
    stop = _FORK.Event()
    process = _FORK.Process(target=_alternate, args=(str(tmp_path), stop))
    process.start()
    try:
        reader = CursorReader(str(tmp_path), [0], token=7)
        reads, torn, deadline = 0, 0, time.monotonic() + 1.5
        while time.monotonic() < deadline:
            cursors = reader.read()
            if cursors is None:
                continue
            (cursor, ) = cursors
            reads += 1
            torn += (cursor.epoch % 2 == 0) != (cursor.consumed == EPOCH_END)
    finally:
        stop.set()
        process.join(10)
    assert reads > 1000 and torn == 0
