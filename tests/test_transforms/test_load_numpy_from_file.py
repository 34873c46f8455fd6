"""LoadNumpyFromFile / read_array: exact arrays, shared memory in workers,
no pickle, clear errors naming the file."""
import functools
import http.server
import os
import pickle
import threading

import numpy as np
import pytest
import torch
from mmengine.fileio import BaseStorageBackend, register_backend
from mmengine.registry import TRANSFORMS
from torch.utils.data import DataLoader

from mmdata_plugin.datasets import ImageListDataset
from mmdata_plugin.transforms import (ArrayFileError, LoadNumpyFromFile,
                                      PackImageLabelInputs, read_array)

ARRAYS = {
    'float32_3d': np.arange(24, dtype=np.float32).reshape(2, 3, 4),
    'fortran_int16': np.asfortranarray(
        np.arange(12, dtype=np.int16).reshape(3, 4)),
    'big_endian': np.arange(6, dtype='>f8').reshape(2, 3),
    'scalar': np.array(3.5),
    'empty': np.zeros((0, 3), np.uint8),
    'bool': np.array([True, False, True]),
    'uint16': np.arange(5, dtype=np.uint16) * 4000,
}


@pytest.mark.parametrize('shared', [False, True])
@pytest.mark.parametrize('name', sorted(ARRAYS))
def test_npy_files_read_exactly(tmp_path, name, shared):
    path = str(tmp_path / f'{name}.npy')
    np.save(path, ARRAYS[name])
    tensor = read_array(path, shared=shared)
    assert tensor.numpy().dtype == ARRAYS[name].dtype.newbyteorder('=')
    assert tensor.shape == ARRAYS[name].shape
    np.testing.assert_array_equal(tensor.numpy(), ARRAYS[name])
    assert tensor.is_shared() == (shared and ARRAYS[name].size > 0)


def test_raw_files_take_dtype_and_shape_from_the_config(tmp_path):
    array = np.arange(60, dtype=np.int32).reshape(3, 4, 5)
    path = tmp_path / 'a.bin'
    array.tofile(path)
    np.testing.assert_array_equal(
        read_array(str(path), 'int32', (3, 4, 5)).numpy(), array)
    np.testing.assert_array_equal(
        read_array(str(path), 'int32', (-1, 4, 5)).numpy(), array)
    np.testing.assert_array_equal(
        read_array(str(path), '<i4').numpy(), array.ravel())


def _error(path, **kwargs):
    with pytest.raises(ArrayFileError) as info:
        read_array(str(path), **kwargs)
    assert str(path) in str(info.value)
    return str(info.value)


def test_truncated_and_mismatched_files_are_refused_naming_the_file(
        tmp_path):
    path = tmp_path / 'a.npy'
    np.save(path, np.zeros((4, 5), np.float32))
    data = path.read_bytes()
    assert 'float32 but the config says dtype=float64' in _error(
        path, dtype='float64')
    assert 'shape (4, 5) but the config says shape=(5, 4)' in _error(
        path, shape=(5, 4))
    assert read_array(str(path), 'float32', (-1, 5)).shape == (4, 5)
    path.write_bytes(data[:-3])
    assert '77 bytes of data for a float32 array of shape (4, 5), which ' \
        'takes 80 bytes (truncated)' in _error(path)
    path.write_bytes(data[:20])
    assert 'not a valid .npy file' in _error(path)
    raw = tmp_path / 'a.raw'
    raw.write_bytes(bytes(80))
    assert 'takes 64 bytes (too long)' in _error(
        raw, dtype='float32', shape=(4, 4))
    assert 'takes 96 bytes (truncated)' in _error(
        raw, dtype='float32', shape=(4, 6))
    assert 'not a whole number' in _error(raw, dtype='float64', shape=(-1, 3))
    assert 'needs dtype' in _error(raw)
    assert 'one -1' in _error(raw, dtype='uint8', shape=(-1, -1))


class _Payload:
    """Unpickling this would create ``marker`` (what an attacker's file
    would do with os.system)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, 'w'))


def test_object_arrays_are_refused_without_unpickling(tmp_path):
    marker = tmp_path / 'pwned'
    array = np.empty(2, dtype=object)
    array[:] = [_Payload(str(marker)), 1]
    path = tmp_path / 'objects.npy'
    np.save(path, array, allow_pickle=True)
    message = _error(path)
    assert 'pickled arrays are refused (allow_pickle=False)' in message
    assert not marker.exists()
    # The same bytes do run code through np.load(allow_pickle=True).
    np.load(path, allow_pickle=True)
    assert marker.exists()


def test_a_tensor_img_is_packed_as_a_chw_view():
    img = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
    packed = PackImageLabelInputs().transform(dict(img=img, gt_label=1))
    assert packed['inputs'].shape == (4, 2, 3)
    assert packed['inputs'].data_ptr() == img.data_ptr()  # not copied
    torch.testing.assert_close(packed['inputs'], img.permute(2, 0, 1))


def _record_sharing(results):
    results['shared_in_worker'] = results['img'].is_shared()
    return results


def _write_list(tmp_path, count=6):
    arrays = []
    lines = []
    for i in range(count):
        array = np.random.default_rng(i).integers(
            0, 255, (8, 6, 3), dtype=np.uint8)
        np.save(tmp_path / f'a{i}.npy', array)
        arrays.append(array)
        lines.append(f'a{i}.npy {i % 3}\n')
    (tmp_path / 'list.txt').write_text(''.join(lines))
    return arrays


@pytest.mark.compat
def test_workers_hand_over_shared_memory_from_a_config_pipeline(tmp_path):
    arrays = _write_list(tmp_path)
    loader = TRANSFORMS.build(dict(type='LoadNumpyFromFile', dtype='uint8'))
    dataset = ImageListDataset(
        ann_file=str(tmp_path / 'list.txt'),
        data_prefix=dict(img_path=str(tmp_path)),
        pipeline=[loader, _record_sharing])
    samples = [
        sample for batch in DataLoader(
            dataset, batch_size=4, num_workers=2, collate_fn=list)
        for sample in batch
    ]
    assert len(samples) == len(arrays)
    for sample, array in zip(samples, arrays):
        # Read into shared memory in the worker: the DataLoader sent a
        # handle, it did not copy the tensor.
        assert sample['shared_in_worker'] is True
        assert sample['img'].is_shared()
        np.testing.assert_array_equal(sample['img'].numpy(), array)
        assert sample['img_shape'] == sample['ori_shape'] == (8, 6)
    # Without workers nothing is shared (no process to hand it to).
    assert not dataset[0]['shared_in_worker']


def test_config_pipeline_packs_for_the_model(tmp_path):
    arrays = _write_list(tmp_path, 2)
    dataset = ImageListDataset(
        ann_file=str(tmp_path / 'list.txt'),
        data_prefix=dict(img_path=str(tmp_path)),
        pipeline=[
            dict(type='LoadNumpyFromFile', shape=(8, 6, -1)),
            dict(type='PackImageLabelInputs')
        ])
    packed = dataset[1]
    torch.testing.assert_close(packed['inputs'],
                               torch.from_numpy(arrays[1]).permute(2, 0, 1))
    assert int(packed['data_samples'].gt_label) == 1


@pytest.fixture
def http_root(tmp_path):
    handler = functools.partial(
        http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield tmp_path, f'http://127.0.0.1:{server.server_port}'
    server.shutdown()
    server.server_close()


def test_remote_paths_are_read_from_their_local_copy(http_root):
    folder, url = http_root
    array = np.arange(10, dtype=np.float32)
    np.save(folder / 'a.npy', array)
    (folder / 'bad.npy').write_bytes((folder / 'a.npy').read_bytes()[:-4])
    transform = LoadNumpyFromFile(key='array')
    out = transform(dict(img_path=f'{url}/a.npy'))
    np.testing.assert_array_equal(out['array'].numpy(), array)
    with pytest.raises(ArrayFileError,
                       match=rf'{url}/bad.npy \(local copy .*\) of sample '
                       r'7: .*\(truncated\)'):
        transform(dict(img_path=f'{url}/bad.npy', sample_idx=7))


def test_pickled_baseline_is_what_we_replace(tmp_path):
    # The benchmark's baseline formats hold the same bytes.
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.save(tmp_path / 'a.npy', array)
    with open(tmp_path / 'a.pkl', 'wb') as f:
        pickle.dump(array, f)
    with open(tmp_path / 'a.pkl', 'rb') as f:
        np.testing.assert_array_equal(pickle.load(f),
                                      read_array(str(tmp_path /
                                                     'a.npy')).numpy())
    assert os.path.getsize(tmp_path / 'a.npy') >= array.nbytes


@pytest.mark.parametrize('path_taken', ['sendfile', 'readinto'])
def test_shared_reads_are_handed_over_without_a_copy(tmp_path, monkeypatch,
                                                     path_taken):
    if path_taken == 'readinto':
        # A platform or file system without memfd/sendfile.
        def no_sendfile(*args):
            raise OSError(22, 'Invalid argument')

        monkeypatch.setattr(os, 'sendfile', no_sendfile)
    array = np.random.default_rng(0).random((64, 33))
    np.save(tmp_path / 'a.npy', array)
    tensor = read_array(str(tmp_path / 'a.npy'), shared=True)
    np.testing.assert_array_equal(tensor.numpy(), array)
    storage = tensor.untyped_storage()
    before = storage.data_ptr()
    # What a DataLoader worker's pickler calls (torch's file_descriptor
    # strategy): a storage that is not in a shared segment with a kept fd
    # would be copied into a new one here.
    storage._share_fd_cpu_()
    assert storage.data_ptr() == before


class _BytesOnlyBackend(BaseStorageBackend):
    """A fileio backend that serves bytes but no local copy (like LMDB)."""

    def get(self, filepath):
        return b''

    def get_text(self, filepath, encoding='utf-8'):
        return ''


def test_a_backend_without_local_copies_is_named():
    register_backend(
        'test_bytes_only', _BytesOnlyBackend, force=True,
        prefixes='bytesonly')
    with pytest.raises(TypeError, match='bytesonly://x/a.npy is served by '
                       '_BytesOnlyBackend, which has no get_local_path'):
        LoadNumpyFromFile()(dict(img_path='bytesonly://x/a.npy'))
