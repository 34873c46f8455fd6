"""Neighbouring tar members downloaded by the node prefetcher with one
range GET of the span covering them, each member's entry cut from it."""
import os
import os.path as osp
import threading
import time

import numpy as np
import pytest
from helpers import key_locked_elsewhere
from test_prefetcher import build, consume, read_file
from torch.utils.data import BatchSampler

from mmdata_plugin.cache.node_store import NodeStore
from mmdata_plugin.datasets import ShardWindowSampler, TarShardDataset
from mmdata_plugin.datasets.tar_shard_writer import pack_image_list
from mmdata_plugin.remote.errors import RemoteIOError
from mmdata_plugin.remote.tar_member_backend import (member_path,
                                                     parse_member_path)
from mmdata_plugin.remote_cache.coalesced_reads import (CoalesceLimits,
                                                        RoundSpans,
                                                        SharedSpan)
from mmdata_plugin.remote_cache.node_cache_backend import (NAMESPACE,
                                                           DownloadNotWanted,
                                                           RemoteReader)
from mmdata_plugin.remote_cache.prefetcher import _ROOM_WAIT
from mmdata_plugin.sample_order import NodeStream, sample_order_of
from mmdata_plugin.testing import LoopbackHTTPServer

SAMPLES, PER_SHARD, SIZE = 96, 24, 1000
LIMITS = CoalesceLimits(max_gap=32 << 10, max_span=1 << 20)


@pytest.fixture(scope='module')
def shards(tmp_path_factory):
    """4 tar shards of 24 samples of ~1 KB (a ``.bin`` and a ``.cls``
    member each)."""
    root = str(tmp_path_factory.mktemp('coalesce'))
    rng = np.random.default_rng(0)
    os.makedirs(osp.join(root, 'data'))
    lines = []
    for sample in range(SAMPLES):
        with open(osp.join(root, 'data', f'{sample}.bin'), 'wb') as file:
            file.write(rng.bytes(int(SIZE * rng.uniform(0.5, 1.5))))
        lines.append(f'data/{sample}.bin {sample % 7}\n')
    with open(osp.join(root, 'train.txt'), 'w') as file:
        file.writelines(lines)
    pack_image_list(osp.join(root, 'train.txt'), root, osp.join(root, 'tar'),
                    'train', PER_SHARD)
    return root


def member_bytes(shards_root):

    def expected(url):
        span = parse_member_path(url)
        name = osp.join(shards_root, 'tar', osp.basename(span.shard))
        with open(name, 'rb') as file:
            file.seek(span.start)
            return file.read(span.length)

    return expected


def shard_window_run(shards, tmp_path, srv, coalesce, download_processes=1,
                     limit=48 * SIZE):
    dataset = TarShardDataset(
        data_root=srv.url('tar/'),
        shards='train-{000000..000003}.tar',
        image_ext='bin',
        ann_ext='cls',
        index_dir=str(tmp_path / 'index'),
        index_progress=False)
    sampler = ShardWindowSampler(dataset, seed=1, window_shards=2)
    stream = NodeStream(sample_order_of(BatchSampler(sampler, 4, False), 1),
                        1, 0, 1)
    srv.reset_stats()
    prefetcher, writer, urls, cache_dir, limit = build(
        tmp_path, count=SAMPLES, limit=limit, reserve=16 * SIZE, readahead=8,
        epochs=2, start_stream=stream,
        urls=lambda sample: [dataset.get_data_info(sample)['img_path']],
        max_inflight=32, download_processes=download_processes,
        coalesce=coalesce)
    peak = consume(prefetcher, writer, urls, cache_dir, limit, 0,
                   prefetcher.stop, expected=member_bytes(shards))
    prefetcher.close()
    return prefetcher, srv.stats(), peak, limit


@pytest.mark.parametrize('download_processes', [1, 2])
def test_a_shard_aware_run_fetches_fewer_gets_than_members(
        shards, tmp_path, download_processes):
    with LoopbackHTTPServer(shards, latency=0.005) as srv:
        prefetcher, stats, peak, limit = shard_window_run(
            shards, tmp_path, srv, LIMITS, download_processes)
    # consume() checked every read's bytes against the shard's.
    produced = prefetcher.store.counters()[NAMESPACE]['produced']
    assert prefetcher.stats['failed'] == 0
    assert peak <= limit
    # The first samples are fetched one by one to learn the size.
    assert stats.get_requests * 3 < produced * 2, (stats.get_requests,
                                                   produced)
    assert stats.duplicate_downloads <= stats.get_requests
    # What the node counts as downloaded (the DataMonitor's remote bytes)
    # is what the server sent, the gaps of coalesced spans included.
    assert prefetcher.store.counters()[NAMESPACE]['produced_bytes'] == \
        stats.bytes_sent


def test_without_coalescing_each_member_is_a_get(shards, tmp_path):
    with LoopbackHTTPServer(shards, latency=0.005) as srv:
        prefetcher, stats, peak, limit = shard_window_run(
            shards, tmp_path, srv, None)
    produced = prefetcher.store.counters()[NAMESPACE]['produced']
    assert stats.get_requests >= produced
    assert peak <= limit


def _urls(shard, spans, size=10_000, tag='"e"'):
    return [[member_path(shard, start, length, size, tag)]
            for start, length in spans]


def test_a_gap_or_a_span_over_the_limits_splits_the_group():
    spans = RoundSpans(CoalesceLimits(max_gap=512, max_span=4096))
    shard = 'http://127.0.0.1:1/a.tar'
    joined = [spans.join(urls) for urls in _urls(
        shard, [(512, 1000), (1900, 1000), (2950, 1700), (5300, 100),
                (3500, 100)])]
    first, second = joined[0][0], joined[2][0]
    # 388 bytes after the first group: joined; the span would pass 4096
    # bytes: split; 650 bytes after the second group: split; inside it:
    # joined.
    assert [opened for _, opened in joined] == [True, False, True, True,
                                                False]
    assert joined[1][0] is first and joined[4][0] is second
    assert joined[3][0] not in (first, second)
    # Other shard versions, local shards and other paths never join.
    assert spans.join(_urls(shard, [(1600, 10)], tag='"f"')[0])[1]
    assert spans.join(_urls('/local/a.tar', [(1600, 10)])[0]) == (None, True)
    assert spans.join(['http://127.0.0.1:1/x.jpg']) == (None, True)
    spans.close()
    cover = parse_member_path(first.span.path)
    assert (cover.start, cover.length) == (512, 2388)
    assert joined[3][0].span is None  # one member reads itself


def test_a_member_whose_slice_is_short_or_outside_is_refused():
    shard = 'http://127.0.0.1:1/a.tar'
    span = SharedSpan(member_path(shard, 1000, 3000, 10_000, '"e"'), 0)
    inside = _urls(shard, [(2000, 500)])[0]
    reads = []

    def short_read(path):
        reads.append(path)
        return bytes(2200)  # the span's end is cut

    with pytest.raises(RemoteIOError, match='0 of the member'):
        span.member_bytes(member_path(shard, 3500, 400, 10_000, '"e"'),
                          short_read)
    assert span.member_bytes(inside[0], short_read) == bytes(500)
    with pytest.raises(RemoteIOError, match='not inside'):
        span.member_bytes(member_path(shard, 3900, 200, 10_000, '"e"'),
                          short_read)
    with pytest.raises(RemoteIOError, match='not inside'):
        span.member_bytes(member_path(shard, 1000, 10, 10_001, '"e"'),
                          short_read)
    assert len(reads) == 1  # one request for the span


class CutSpan(SharedSpan):
    """A span whose request comes back one byte short."""

    def member_bytes(self, url, read):
        return super().member_bytes(url, lambda path: read(path)[:-1])


def test_a_member_cut_short_gets_no_entry(shards, tmp_path):
    with LoopbackHTTPServer(shards, latency=0.005) as srv:
        dataset = TarShardDataset(
            data_root=srv.url('tar/'), shards='train-000000.tar',
            image_ext='bin', ann_ext='cls',
            index_dir=str(tmp_path / 'index'), index_progress=False)
        paths = [dataset.get_data_info(i)['img_path'] for i in range(4)]
        first, last = parse_member_path(paths[0]), parse_member_path(
            paths[-1])
        span = CutSpan(
            member_path(first.shard, first.start,
                        last.start + last.length - first.start, first.size,
                        first.tag), 0)
        reader = RemoteReader(NodeStore(str(tmp_path / 'cache'), 1 << 20))
        expected = member_bytes(shards)
        for path in paths[:-1]:
            with reader.fetch(path, span=span) as entry:
                assert read_file(entry.path) == expected(path)
        srv.reset_stats()
        with pytest.raises(RemoteIOError, match='of the member'):
            reader.fetch(paths[-1], span=span)
        assert srv.stats().get_requests == 0  # one request for the span
        assert reader.store.lookup(NAMESPACE, paths[-1]) is None
        # Its reader reads it on its own, right.
        with reader.fetch(paths[-1]) as entry:
            assert read_file(entry.path) == expected(paths[-1])


def test_coalesced_requests_under_faults_serve_the_right_bytes(
        shards, tmp_path):
    # A remote failing a fifth of its requests (5xx, bodies cut short):
    # a span's read is retried and resumed as a member's is, and every
    # read, through a span or on demand, has the member's bytes.
    with LoopbackHTTPServer(shards, latency=0.002, fault_rate=0.2,
                            fault_kinds=('5xx', 'truncated')) as srv:
        prefetcher, stats, peak, limit = shard_window_run(
            shards, tmp_path, srv, LIMITS)
    assert stats.faults['5xx'] and stats.faults['truncated']
    assert prefetcher.status()['coalesced_requests'] > 0
    assert peak <= limit


def _span_of(paths, max_gap):
    """The span covering ``paths`` (members of one shard)."""
    members = [parse_member_path(path) for path in paths]
    start = min(m.start for m in members)
    end = max(m.start + m.length for m in members)
    return SharedSpan(
        member_path(members[0].shard, start, end - start, members[0].size,
                    members[0].tag), max_gap)


def _one_shard(srv, tmp_path, count):
    dataset = TarShardDataset(
        data_root=srv.url('tar/'), shards='train-000000.tar',
        image_ext='bin', ann_ext='cls', index_dir=str(tmp_path / 'index'),
        index_progress=False)
    paths = [dataset.get_data_info(i)['img_path'] for i in range(count)]
    # the dataset's first samples are the shard's first members, in order
    assert [parse_member_path(p).start for p in paths] == sorted(
        parse_member_path(p).start for p in paths)
    return paths


def test_a_reader_waits_for_the_span_holding_its_member(shards, tmp_path):
    # A reader reaching a member while the span that holds it is being
    # read waits for the span's bytes: no GET of its own, no byte twice.
    with LoopbackHTTPServer(shards, latency=0.4,
                            log_downloads=True) as srv:
        paths = _one_shard(srv, tmp_path, 4)
        span = _span_of(paths, LIMITS.max_gap)
        prefetch = RemoteReader(NodeStore(str(tmp_path / 'cache'), 1 << 20))
        # another process's reader (a DataLoader worker): own store object
        reader = RemoteReader(NodeStore(str(tmp_path / 'cache'), 1 << 20))
        srv.reset_stats()
        claimed = threading.Event()

        def produce_span():
            with prefetch.claimed(span, paths, 30):
                assert len(span.holds.held()) == 4
                claimed.set()
                for path in paths:
                    with prefetch.fetch(path, span=span):
                        pass

        thread = threading.Thread(target=produce_span)
        thread.start()
        assert claimed.wait(30)
        with reader.fetch(paths[2]) as entry:
            assert read_file(entry.path) == member_bytes(shards)(paths[2])
        thread.join(30)
        assert srv.stats().get_requests == 1
        assert len(srv.download_log()) == 1
        assert reader.store.counters()[NAMESPACE]['waited'] == 1


@pytest.mark.parametrize('across', [False, True])
def test_a_span_reads_only_the_members_no_one_has(shards, tmp_path, across):
    # Of 6 members, one was read already and one is being produced by
    # another: the span holds and produces the other 4, in one request
    # per run that max_gap joins (the held-elsewhere one at the end is
    # never read; the present one between runs only when max_gap reaches
    # across it).
    with LoopbackHTTPServer(shards, latency=0.002,
                            log_downloads=True) as srv:
        paths = _one_shard(srv, tmp_path, 6)
        members = [parse_member_path(p) for p in paths]
        ends = [m.start + m.length for m in members]
        neighbours = max(members[i + 1].start - ends[i] for i in range(5))
        over = members[3].start - ends[1]
        assert neighbours < over
        max_gap, reads = (over, 1) if across else (neighbours, 2)
        store = NodeStore(str(tmp_path / 'cache'), 1 << 20)
        prefetch = RemoteReader(store)
        with prefetch.fetch(paths[2]):
            pass
        srv.reset_stats()
        span = _span_of(paths, max_gap)
        with key_locked_elsewhere(store, prefetch.entry_digest(paths[5])):
            with prefetch.claimed(span, paths, 30):
                assert len(span.holds.held()) == 4
                for path in paths[:5]:
                    with prefetch.fetch(path, span=span) as entry:
                        assert read_file(entry.path) == member_bytes(shards)(
                            path)
                with pytest.raises(DownloadNotWanted):
                    prefetch.fetch(paths[5], span=span)
        log = srv.download_log()
        assert len(log) == reads
        read = [(start, start + size) for _, _, size, start in log]
        assert all(end <= members[5].start for _, end in read)
        if not across:  # the present member's bytes are not read again
            assert all(end <= members[2].start or start >= ends[2]
                       for start, end in read)


def test_a_span_lets_its_keys_go_once_held_too_long(shards, tmp_path):
    # Members produced in turn may each wait for room: past hold_for the
    # span lets the keys it still holds go, and their readers read.
    with LoopbackHTTPServer(shards, latency=0.002) as srv:
        paths = _one_shard(srv, tmp_path, 3)
        store = NodeStore(str(tmp_path / 'cache'), 1 << 20)
        prefetch = RemoteReader(store)
        span = _span_of(paths, LIMITS.max_gap)
        last = prefetch.entry_digest(paths[2])
        with prefetch.claimed(span, paths, 0.2):
            span.let_go_if_late()
            assert span.holds.holds(last)
            time.sleep(0.3)
            span.let_go_if_late()
            assert not span.holds.holds(last)
            with store._key_lock(last, blocking=False) as locked:
                assert locked  # a reader gets it at once
            with pytest.raises(DownloadNotWanted):
                prefetch.fetch(paths[2], span=span)


@pytest.mark.parametrize('failing', ['hold_keys', 'claim'])
def test_a_span_whose_keys_cannot_be_held_is_read_as_before(
        shards, tmp_path, monkeypatch, failing):
    # No file descriptor left (say): the span is read unclaimed, every
    # member right, no key left locked.
    with LoopbackHTTPServer(shards, latency=0.002,
                            log_downloads=True) as srv:
        paths = _one_shard(srv, tmp_path, 3)
        store = NodeStore(str(tmp_path / 'cache'), 1 << 20)
        prefetch = RemoteReader(store)
        span = _span_of(paths, LIMITS.max_gap)
        target = store if failing == 'hold_keys' else span

        def fail(*args, **kwargs):
            raise OSError(24, 'Too many open files')

        monkeypatch.setattr(target, failing, fail)
        srv.reset_stats()
        with prefetch.claimed(span, paths, 30):
            assert span.holds is None
            for path in paths:
                with store._key_lock(prefetch.entry_digest(path),
                                     blocking=False) as locked:
                    assert locked
                with prefetch.fetch(path, span=span) as entry:
                    assert read_file(entry.path) == member_bytes(shards)(path)
        assert len(srv.download_log()) == 1  # the whole span, once


def test_a_span_lets_the_rest_go_when_a_member_finds_no_room(
        shards, tmp_path):
    # The prefetcher's download of a span's first member waits the room
    # wait for room in a full budget, in vain: the span lets the rest go
    # rather than make their readers wait as long again, each.
    with LoopbackHTTPServer(shards, latency=0.002) as srv:
        dataset = TarShardDataset(
            data_root=srv.url('tar/'), shards='train-000000.tar',
            image_ext='bin', ann_ext='cls',
            index_dir=str(tmp_path / 'index'), index_progress=False)
        prefetcher, _, urls, _, _ = build(
            tmp_path, count=PER_SHARD, limit=8 * SIZE, reserve=2 * SIZE,
            urls=lambda sample: [dataset.get_data_info(sample)['img_path']],
            coalesce=LIMITS)
        paths = [urls(sample)[0] for sample in range(3)]
        span = _span_of(paths, LIMITS.max_gap)
        store = prefetcher.store
        with store.reserve(store.limit, evict=False):  # nothing is free
            began = time.monotonic()
            prefetcher._download_in_turn([(sample, [paths[sample]], SIZE,
                                           span) for sample in range(3)])
            took = time.monotonic() - began
        prefetcher.close()
    assert prefetcher.stats['no_room'] == 1  # the others were not tried
    assert took < 2 * _ROOM_WAIT  # not one room wait per member
    for path in paths:
        assert store.lookup(NAMESPACE, path) is None
        with store._key_lock(prefetcher.reader.entry_digest(path),
                             blocking=False) as locked:
            assert locked
