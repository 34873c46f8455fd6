"""Each function of utils/torch_internals.py on the installed torch/mmengine.

Part of the compatibility selection: the private names these wrap are what
a torch or mmengine release can change without notice.
"""
import io
import multiprocessing
import os

import numpy as np
import pytest
import torch
from mmengine.dataset import BaseDataset, InfiniteSampler
from mmengine.logging import HistoryBuffer
from mmengine.runner.loops import _InfiniteDataloaderIterator
from torch.utils.data import DataLoader

from mmdata_plugin.utils import torch_internals as internals

pytestmark = pytest.mark.compat


class _Numbers(torch.utils.data.Dataset):

    def __len__(self):
        return 8

    def __getitem__(self, index):
        return index


def test_persistent_iterator_is_found_shut_down_and_forgotten():
    loader = DataLoader(_Numbers(), batch_size=2, num_workers=1,
                        persistent_workers=True)
    assert internals.started_iterator(loader) is None
    first = iter(loader)
    assert internals.is_dataloader_iterator(first)
    assert internals.started_iterator(loader) is first
    assert next(first).tolist() == [0, 1]
    internals.shutdown_workers(first)
    assert not any(worker.is_alive() for worker in first._workers)
    internals.forget_started_iterator(loader)
    second = iter(loader)
    assert second is not first
    assert next(second).tolist() == [0, 1]
    internals.shutdown_workers(second)


def test_shutdown_workers_takes_our_streams_and_plain_iterators():
    stopped = []

    class Stream:

        def shutdown_workers(self):
            stopped.append(True)

    internals.shutdown_workers(Stream())
    internals.shutdown_workers(iter([1]))  # nothing to stop
    assert stopped == [True]
    assert not internals.is_dataloader_iterator(iter([1]))


def test_pin_memory_hands_custom_batches_their_pin_memory():

    class Batch:

        def pin_memory(self, *args):
            return 'pinned'

    assert internals.pin_memory({'b': Batch(), 'n': 3}) == {
        'b': 'pinned',
        'n': 3
    }


def _report_worker_info(queue):
    internals.act_as_worker('dataset', seed=7)
    info = torch.utils.data.get_worker_info()
    queue.put((info.id, info.num_workers, info.seed, info.dataset))


def test_act_as_worker_answers_get_worker_info():
    context = multiprocessing.get_context('fork')
    queue = context.Queue()
    process = context.Process(target=_report_worker_info, args=(queue, ))
    process.start()
    assert queue.get(timeout=60) == (0, 1, 7, 'dataset')
    process.join()
    assert torch.utils.data.get_worker_info() is None


def test_new_shared_storage_lives_in_shared_memory():
    storage = internals.new_shared_storage(64)
    assert storage.is_shared() and storage.nbytes() == 64


def test_storage_of_segment_reads_the_segment():
    segment = os.memfd_create('torch_internals_test')
    try:
        os.write(segment, b'abcdefgh')
        storage = internals.storage_of_segment(segment, 8)
    finally:
        os.close(segment)
    tensor = torch.empty(0, dtype=torch.uint8).set_(storage)
    assert bytes(tensor.tolist()) == b'abcdefgh'
    assert storage.is_shared()


def test_tensor_and_storage_classes():
    classes = internals.tensor_and_storage_classes()
    assert torch.FloatTensor in classes and torch.FloatStorage in classes


def test_archive_record_reads_data_pkl():
    saved = io.BytesIO()
    torch.save({'w': torch.ones(2)}, saved)
    saved.seek(0)
    assert internals.archive_record(saved, 'data.pkl')[:2] == b'\x80\x02'
    saved.seek(0)
    assert internals.archive_record(saved, 'missing.pkl') is None


def test_read_global_instruction_maps_python2_names():
    lines = iter([b'__builtin__\n', b'bytes\n'])
    assert internals.read_global_instruction(lambda: next(lines)) == (
        'builtins', 'bytes')


@pytest.mark.parametrize('own', [False, True])
def test_weights_only_load_binds_names_and_refuses_others(own, monkeypatch):
    if own:
        monkeypatch.setattr(internals, '_TORCH_BINDS_NAMES', False)
    elif not internals._TORCH_BINDS_NAMES:
        pytest.skip('torch < 2.6 binds no stand-ins to names')
    saved = io.BytesIO()
    torch.save({'w': torch.ones(2), 'n': np.int64(3).item()}, saved)
    saved.seek(0)
    loaded = internals.weights_only_load(saved, 'cpu', [])
    assert loaded['w'].tolist() == [1.0, 1.0] and loaded['n'] == 3

    saved = io.BytesIO()
    torch.save({'f': os.getcwd}, saved)
    saved.seek(0)
    with pytest.raises(Exception, match='posix.getcwd'):
        internals.weights_only_load(saved, 'cpu', [])
    saved.seek(0)
    assert internals.unsafe_globals_in_checkpoint(saved, []) == [
        'posix.getcwd'
    ]
    saved.seek(0)
    stand_in = (lambda: 'stood in', 'posix.getcwd')
    assert internals.unsafe_globals_in_checkpoint(saved, [stand_in]) == []


def test_held_iterator_of_mmengines_infinite_iterator():
    loader = DataLoader(_Numbers(), batch_size=4)
    holder = _InfiniteDataloaderIterator(loader)
    assert next(holder).tolist() == [0, 1, 2, 3]
    held = internals.held_iterator(holder)
    assert internals.is_dataloader_iterator(held)
    internals.set_held_iterator(holder, iter(loader))
    assert next(holder).tolist() == [0, 1, 2, 3]
    assert internals.held_iterator(object()) is None


def test_rewind_infinite_sampler_restarts_its_stream():
    sampler = InfiniteSampler(list(range(10)), shuffle=True, seed=3)
    stream = iter(sampler)
    first = [next(stream) for _ in range(5)]
    internals.rewind_infinite_sampler(sampler)
    stream = iter(sampler)
    assert [next(stream) for _ in range(5)] == first


class _LazyDataset(BaseDataset):

    def load_data_list(self):
        return [dict(value=i) for i in range(4)]


def test_base_dataset_internals():
    dataset = _LazyDataset(
        metainfo=dict(classes=('a', )), indices=2, lazy_init=True)
    assert not internals.dataset_initialized(dataset)
    assert internals.dataset_indices(dataset) == 2
    internals.dataset_metainfo(dataset)['palette'] = [1]
    assert dataset.metainfo['palette'] == [1]
    dataset.full_init()
    assert internals.dataset_initialized(dataset) and len(dataset) == 2
    copy = internals.copy_without_annotation(dataset)
    assert type(copy) is _LazyDataset and copy.metainfo == dataset.metainfo
    lazy = _LazyDataset(lazy_init=True)
    internals.mark_dataset_initialized(lazy)
    assert internals.dataset_initialized(lazy)


def test_fill_history_buffer():
    buffer = HistoryBuffer()
    internals.fill_history_buffer(buffer, np.array([1.0, 3.0]),
                                  np.array([1, 1]))
    assert buffer.mean() == 2.0 and buffer.current() == 3.0


def test_set_only_value():
    buffer = HistoryBuffer([0.5], [1])
    internals.set_only_value(buffer, 0.25)
    assert buffer.mean(10) == 0.25 and buffer.current() == 0.25
    assert buffer.statistics('mean', 10) == 0.25


def test_mmengine_checkpoint_and_config_helpers():
    assert isinstance(internals.mmengine_home(), str)
    converted = internals.process_mmcls_checkpoint(
        dict(state_dict={
            'backbone.conv': torch.ones(1),
            'head.fc': torch.ones(1)
        }))
    assert list(converted['state_dict']) == ['conv']
    assert internals.package_and_cfg_path('mmdet::retinanet/r50.py') == (
        'mmdet', 'retinanet/r50.py')


def test_set_loop_counters_refuses_unknown_names():

    class Loop:
        pass

    loop = Loop()
    internals.set_loop_counters(loop, iter=3, epoch=1)
    assert (loop._iter, loop._epoch) == (3, 1)
    with pytest.raises(AttributeError, match='iters'):
        internals.set_loop_counters(loop, iters=3)
