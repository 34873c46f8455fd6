"""The tar shard index and the tarmember:// backend: local, HTTP and S3."""
import gzip
import io
import json
import os
import pickle
import tarfile

import numpy as np
import pytest
from mmengine import fileio

from mmdata_plugin.datasets import (StaleIndexError, TarShardError,
                                    TarShardIndex, ensure_tar_shard_index)
from mmdata_plugin.remote import (ShardChangedError, TarMemberBackend,
                                  member_path, parse_member_path)
from mmdata_plugin.testing import LoopbackHTTPServer, MotoS3Server

EXTS = ['jpg', 'cls']


def sample_members(shard, count=6):
    """WebDataset samples: every other key is long (GNU/pax headers)."""
    samples = []
    for i in range(count):
        stem = 'x' * 150 if i % 2 else 'k'
        key = f'dir{shard}/{stem}{shard}_{i}'
        payload = bytes([shard, i]) * (50 + 7 * i + shard)
        samples.append((key, [('jpg', payload), ('cls', str(i % 4).encode()),
                              ('txt', b'caption')]))
    return samples


def tar_bytes(samples, fmt=tarfile.GNU_FORMAT):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode='w', format=fmt) as tar:
        for key, members in samples:
            for ext, data in members:
                info = tarfile.TarInfo(f'{key}.{ext}')
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def write_shards(folder, count=3, fmt=tarfile.GNU_FORMAT):
    paths, expected = [], []
    for shard in range(count):
        samples = sample_members(shard)
        path = str(folder / f'shard-{shard:06d}.tar')
        with open(path, 'wb') as file:
            file.write(tar_bytes(samples, fmt))
        paths.append(path)
        expected += samples
    return paths, expected


def check_every_member(index, expected, **get_args):
    assert index.num_samples == len(expected)
    for sample, (key, members) in enumerate(expected):
        members = dict(members)
        assert index.key(sample) == key
        assert fileio.get(index.member_path(sample, 'jpg'),
                          **get_args) == members['jpg']
        assert fileio.get(index.member_path(sample, 'cls'),
                          **get_args) == members['cls']
        assert index.label(sample) == int(members['cls'])


@pytest.mark.parametrize('fmt', [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_local_index_reads_every_member_exactly(tmp_path, fmt):
    shards, expected = write_shards(tmp_path, fmt=fmt)
    path = str(tmp_path / 'train.taridx')
    index = ensure_tar_shard_index(shards, path, EXTS, progress=False)
    # A view of the mapped file, no copy in memory.
    assert isinstance(index.records.base, np.memmap)
    # 4 B shard + 2 x (8 B offset + 8 B size) + 8 B label
    assert index.records.dtype.itemsize == 44
    check_every_member(index, expected)

    # Reopened (another run): the same file, not rebuilt; a pickled index
    # (a spawned worker) maps it again.
    built = os.stat(path).st_mtime_ns
    again = ensure_tar_shard_index(shards, path, EXTS, progress=False)
    assert os.stat(path).st_mtime_ns == built
    check_every_member(pickle.loads(pickle.dumps(again)), expected)


def _rewrite_header(path, change):
    """The index file with its JSON header changed by ``change``."""
    data = open(path, 'rb').read()
    offset = int.from_bytes(data[-16:-8], 'little')
    header = json.loads(data[offset:-16])
    change(header)
    encoded = json.dumps(header).encode()
    with open(path, 'wb') as file:
        file.write(data[:offset] + encoded + data[-16:])


@pytest.mark.parametrize('damage', [
    lambda h: h.update(keys_offset=h['keys_offset'] + 10**9),
    lambda h: h.update(num_samples=h['num_samples'] + 1),
    lambda h: h.pop('shards'),
    lambda h: h.update(exts='jpg'),
])
def test_a_damaged_index_header_is_rebuilt_not_mapped(tmp_path, damage):
    shards, expected = write_shards(tmp_path)
    path = str(tmp_path / 'train.taridx')
    ensure_tar_shard_index(shards, path, EXTS, progress=False)
    _rewrite_header(path, damage)
    with pytest.raises(StaleIndexError, match='damaged header'):
        TarShardIndex(path)
    check_every_member(
        ensure_tar_shard_index(shards, path, EXTS, progress=False), expected)


def test_a_record_naming_no_shard_is_refused(tmp_path):
    shards, _ = write_shards(tmp_path)
    path = str(tmp_path / 'train.taridx')
    index = ensure_tar_shard_index(shards, path, EXTS, progress=False)
    with open(path, 'r+b') as file:  # sample 3's shard number: 7
        file.seek(index.header['records_offset'] +
                  3 * index.records.dtype.itemsize)
        file.write((7).to_bytes(4, 'little'))
    with pytest.raises(StaleIndexError, match='sample 3 names shard 7 of 3'):
        TarShardIndex(path).member_path(3, 'jpg')


def test_member_path_round_trips_urls_mmengine_would_split(tmp_path):
    url = 'https://h:8/a%20b/s.tar?sig=s3://x&y=1#frag@user'
    path = member_path(url, 1536, 20, 10240, 'W/"ab+c:d/e"')
    assert path.count('://') == 1  # mmengine splits a path at its '://'
    assert parse_member_path(path) == (url, 1536, 20, 10240, 'W/"ab+c:d/e"')
    assert isinstance(fileio.get_file_backend(path), TarMemberBackend)


def test_local_shard_changed_is_refused_or_rebuilt(tmp_path):
    shards, expected = write_shards(tmp_path)
    path = str(tmp_path / 'train.taridx')
    index = ensure_tar_shard_index(shards, path, EXTS, progress=False)
    stale_path = index.member_path(7, 'jpg')
    samples = sample_members(1, count=4)
    with open(shards[1], 'wb') as file:
        file.write(tar_bytes(samples))

    # A path read after the change: refused, naming the shard.
    with pytest.raises(ShardChangedError, match=shards[1]):
        fileio.get(stale_path)
    with pytest.raises(StaleIndexError, match=f'shard {shards[1]} changed'):
        ensure_tar_shard_index(shards, path, EXTS, on_stale='error',
                               progress=False)
    rebuilt = ensure_tar_shard_index(shards, path, EXTS, progress=False)
    check_every_member(rebuilt, expected[:6] + samples + expected[12:])


def test_short_read_names_the_path(tmp_path):
    shards, _ = write_shards(tmp_path, count=1)
    stat = os.stat(shards[0])
    path = member_path(shards[0], stat.st_size - 10, 20, stat.st_size,
                       str(stat.st_mtime_ns))
    with pytest.raises(OSError, match='read 10 of the member'):
        fileio.get(path)


def _interleaved():
    (a, members_a), (b, members_b) = sample_members(0, count=2)
    return tar_bytes([(a, members_a[:1]), (b, members_b), (a, members_a[1:])])


def _truncated_in_data():
    # k0_0.jpg's 100 bytes start at 512
    return tar_bytes(sample_members(0))[:512 + 50]


def _cut_between_members():
    return tar_bytes(sample_members(0))[:2048]


def _truncated_in_header():
    data = tar_bytes(sample_members(0))
    # Inside the long-name header of the fourth member: the stream reader
    # stops there as at an end; the non-zero tail gives it away.
    return data[:tarfile.open(fileobj=io.BytesIO(data)).getmembers()[3]
                .offset + 300]


def _sparse():
    # A pax sparse member: 1 byte stored, 100 bytes when expanded.
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode='w',
                      format=tarfile.PAX_FORMAT) as tar:
        for name, body, pax in (('a.jpg', b'x', {
                'GNU.sparse.map': '0,1',
                'GNU.sparse.size': '100'
        }), ('a.cls', b'1', {})):
            info = tarfile.TarInfo(name)
            info.size, info.pax_headers = len(body), pax
            tar.addfile(info, io.BytesIO(body))
    return data.getvalue()


def _named(*names):
    """A GNU tar of members with these raw (byte) names."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode='w', format=tarfile.GNU_FORMAT,
                      encoding='utf-8', errors='surrogateescape') as tar:
        for raw in names:
            info = tarfile.TarInfo(raw.decode('utf-8', 'surrogateescape'))
            info.size = 1
            tar.addfile(info, io.BytesIO(b'1'))
    return data.getvalue()


BAD_SHARDS = dict(
    not_a_tar=(b'hello world' * 100, 'not a tar file'),
    empty=(b'', 'not a tar file'),
    gzip=(gzip.compress(tar_bytes(sample_members(0))),
          'gzip-compressed tar'),
    cut_in_data=(_truncated_in_data(),
                 "truncated: member 'dir0/k0_0.jpg' at byte 0 ends at byte "
                 '612, the shard at 562'),
    cut_in_header=(_truncated_in_header(),
                   r'damaged or truncated tar: byte \d+ starts'),
    cut_between_members=(_cut_between_members(),
                         'ends at byte 2048 after a member, without the '
                         'end-of-archive'),
    not_consecutive=(_interleaved(),
                     r"members of sample 'dir0/k0_0' are not consecutive: "
                     r"'dir0/k0_0.cls' at byte \d+"),
    missing_ext=(tar_bytes([('a', [('jpg', b'1')])]),
                 r"sample 'a' \(from byte 0\) has no .cls member; it has "
                 r"\['jpg'\]"),
    member_twice=(tar_bytes([('a', [('jpg', b'1'), ('cls', b'1'),
                                    ('jpg', b'2')])]),
                  r"sample 'a' has two .jpg members \(the second, 'a.jpg', "
                  r'at byte 2048\)'),
    sparse=(_sparse(), r"member 'a.jpg' at byte 0 is a sparse file"),
    huge_label=(tar_bytes([('a', [('jpg', b'1'), ('cls', b'7' * 65)])]),
                r"'a.cls' at byte 1024 holds b'7777"),
    key_not_utf8=(_named(b'\xff\xfe.jpg', b'\xff\xfe.cls'),
                  r'the key of the sample at byte 0 is not UTF-8'),
    bad_label=(tar_bytes([('a', [('jpg', b'1'), ('cls', b'dog')])]),
               r"'a.cls' at byte 1024 holds b'dog', not an integer class "
               'label'),
)


@pytest.mark.parametrize('case', sorted(BAD_SHARDS))
def test_bad_shards_are_named(tmp_path, case):
    content, message = BAD_SHARDS[case]
    good, _ = write_shards(tmp_path, count=1)
    bad = str(tmp_path / 'bad.tar')
    with open(bad, 'wb') as file:
        file.write(content)
    with pytest.raises(TarShardError, match=message) as error:
        ensure_tar_shard_index(good + [bad], str(tmp_path / 'i.taridx'), EXTS,
                               progress=False)
    assert bad in str(error.value)
    assert not os.path.exists(tmp_path / 'i.taridx')


def test_key_split_across_shards_is_refused(tmp_path):
    (key, members), = sample_members(0, count=1)
    shards = []
    for number, part in enumerate((members[:1], members[1:])):
        shards.append(str(tmp_path / f'{number}.tar'))
        with open(shards[-1], 'wb') as file:
            file.write(tar_bytes([(key, part)]))
    with pytest.raises(TarShardError,
                       match=f'{shards[1]}: sample {key!r} .* continues the '
                       f'last sample of {shards[0]}'):
        ensure_tar_shard_index(shards, str(tmp_path / 'i.taridx'), ['jpg'],
                               progress=False)


def remote_objects():
    objects, expected = {}, []
    for shard in range(3):
        samples = sample_members(shard)
        objects[f'shards/s-{shard}.tar'] = tar_bytes(samples)
        expected += samples
    return objects, expected


def test_http_shards_streamed_once_and_members_range_read(tmp_path):
    objects, expected = remote_objects()
    with LoopbackHTTPServer(objects) as srv:
        shards = [srv.url(name) for name in objects]
        index = ensure_tar_shard_index(shards, str(tmp_path / 'i.taridx'),
                                       EXTS, progress=False)
        assert srv.stats().get_requests == len(shards)
        check_every_member(index, expected)  # no backend_args at all
        assert srv.stats().get_requests == len(shards) + 2 * len(expected)

        stale_path = index.member_path(0, 'jpg')
        srv.put('shards/s-0.tar', tar_bytes(sample_members(0, count=5)))
        with pytest.raises(ShardChangedError,
                           match=f'{shards[0]} changed after its index'):
            fileio.get(stale_path)


def test_s3_shards_with_backend_args(tmp_path):
    objects, expected = remote_objects()
    with MotoS3Server() as s3:
        s3.put_objects('data', objects)
        shards = [f's3://data/{name}' for name in objects]
        index = ensure_tar_shard_index(shards, str(tmp_path / 'i.taridx'),
                                       EXTS, s3.backend_args(),
                                       progress=False)
        member_args = dict(backend_args=dict(
            backend='tarmember', shard_backend_args=s3.backend_args()))
        check_every_member(index, expected, **member_args)
        assert TarShardIndex(index.path).shards[0]['etag']

        stale_path = index.member_path(7, 'jpg')
        s3.put_objects('data', {'shards/s-1.tar': objects['shards/s-0.tar']})
        with pytest.raises(ShardChangedError, match=shards[1]):
            fileio.get(stale_path, **member_args)
