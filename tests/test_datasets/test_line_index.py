import json
import multiprocessing
import os
import os.path as osp

import pytest

from mmdata_plugin.datasets import (AnnotationFormatError, LineIndex,
                                    RankShardedDataset, StaleIndexError,
                                    build_line_index, ensure_line_index)
from mmdata_plugin.datasets import line_index as line_index_module
from mmdata_plugin.datasets.line_index import (ByteProgressBar,
                                               default_index_path,
                                               index_problem)

LINES = b'a.jpg 1\n\n  \nb c.jpg 22\r\nx.jpg 0   \nlast.jpg 3'


def _write(path, data):
    path.write_bytes(data)
    return str(path)


def _texts(index):
    return [
        index.read(i).decode().strip() for i in range(index.num_samples)
    ]


@pytest.mark.parametrize('chunk', [7, 16, 1 << 20])
def test_index_spans_every_sample_across_chunk_sizes(tmp_path, monkeypatch,
                                                     chunk):
    # Tiny chunks: lines cross chunk ends and outgrow the buffer.
    monkeypatch.setattr(line_index_module, '_CHUNK_SIZE', chunk)
    ann = _write(tmp_path / 'ann.txt', LINES)
    index = ensure_line_index(ann, ann + '.idx', 'lines')
    assert _texts(index) == ['a.jpg 1', 'b c.jpg 22', 'x.jpg 0', 'last.jpg 3']
    assert index.header['num_lines'] == 6
    assert [index.line_number(i) for i in range(4)] == [1, 4, 5, 6]


def test_index_is_reused_and_rebuilt_when_the_file_changes(tmp_path):
    ann = _write(tmp_path / 'ann.txt', LINES)
    index_path = default_index_path(ann)
    assert index_path == ann + '.idx'
    ensure_line_index(ann, index_path, 'lines')
    built = os.stat(index_path).st_mtime_ns
    ensure_line_index(ann, index_path, 'lines')
    assert os.stat(index_path).st_mtime_ns == built  # reused

    with open(ann, 'ab') as f:
        f.write(b'\nmore.jpg 5\n')
    assert 'the annotation file changed' in index_problem(
        index_path, ann, 'lines')
    with pytest.raises(StaleIndexError, match=r'does not match .*ann\.txt'):
        ensure_line_index(ann, index_path, 'lines', on_stale='error')
    assert ensure_line_index(ann, index_path, 'lines').num_samples == 5


def test_same_size_and_mtime_but_new_content_is_stale(tmp_path):
    ann = _write(tmp_path / 'ann.txt', LINES)
    ensure_line_index(ann, ann + '.idx', 'lines')
    stat = os.stat(ann)
    _write(tmp_path / 'ann.txt', LINES.replace(b'a.jpg 1', b'z.jpg 9'))
    os.utime(ann, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert 'edges' in index_problem(ann + '.idx', ann, 'lines')


def test_truncated_or_foreign_index_is_rebuilt(tmp_path):
    ann = _write(tmp_path / 'ann.txt', LINES)
    index = ensure_line_index(ann, ann + '.idx', 'lines')
    with open(index.path, 'r+b') as f:
        f.truncate(os.path.getsize(index.path) - 8)
    assert 'truncated' in index_problem(index.path, ann, 'lines')
    assert ensure_line_index(ann, index.path, 'lines').num_samples == 4
    other = _write(tmp_path / 'other.txt', LINES + b'\nmore.jpg 5')
    assert 'the annotation file changed' in index_problem(
        index.path, other, 'lines')
    _write(tmp_path / 'ann.txt.idx', b'junk')
    assert 'not a line index' in index_problem(index.path, ann, 'lines')
    # Our magic, a header of another version or shape (another tool's).
    for header in (dict(version=2, count=4), [1, 2]):
        _write(tmp_path / 'ann.txt.idx', (line_index_module._MAGIC + json.dumps(
            header).encode()).ljust(line_index_module._HEADER_SIZE, b'\0'))
        assert 'index version' in index_problem(index.path, ann, 'lines')
        assert ensure_line_index(ann, index.path, 'lines').num_samples == 4


def test_a_killed_build_leaves_nothing_behind_for_long(tmp_path):
    # kill -9 (or torchrun stopping the ranks) mid-build skips the cleanup:
    # the next build of that index removes the dead builder's temp file,
    # never a live one's.
    from mmdata_plugin.cache.process_owner import (current_owner,
                                                   owner_file_name)
    child = multiprocessing.get_context('fork').Process(target=current_owner)
    child.start()
    child.join()
    ann = _write(tmp_path / 'ann.txt', LINES)
    dead = current_owner().rsplit(':', 2)[0] + f':{child.pid}:1'
    # (a live builder's own name differs from this process's build)
    temps = [
        f'{ann}.idx.tmp.{owner_file_name(owner, unique)}'
        for owner, unique in ((dead, 'index'), (current_owner(), 'other'))
    ]
    for temp in temps:
        with open(temp, 'wb') as file:
            file.write(b'\0' * 4096)
    assert ensure_line_index(ann, ann + '.idx', 'lines').num_samples == 4
    assert [osp.exists(temp) for temp in temps] == [False, True]


def test_a_file_that_shrank_under_an_open_index_is_refused(tmp_path):
    # Rewritten in place (`make_list > train.txt`) while workers read it:
    # naming the line of the last sample must not loop on reads past EOF.
    ann = _write(tmp_path / 'ann.txt', LINES)
    index = ensure_line_index(ann, ann + '.idx', 'lines')
    index.read(3)
    with open(ann, 'r+b') as f:
        f.truncate(os.path.getsize(ann) // 2)
    with pytest.raises(StaleIndexError, match='changed after its index'):
        index.read(3)


def test_changed_during_training_is_refused_at_open(tmp_path):
    ann = _write(tmp_path / 'ann.txt', LINES)
    index = ensure_line_index(ann, ann + '.idx', 'lines')
    reopened = LineIndex(index.path)  # as a new worker process would
    with open(ann, 'ab') as f:
        f.write(b'\nmore.jpg 5\n')
    with pytest.raises(StaleIndexError, match='changed after its index'):
        reopened.read(0)


def _build_in_child(ann, index_path, log):
    real_build = line_index_module.build_line_index

    def recording_build(*args, **kwargs):
        with open(log, 'a') as f:
            f.write(f'{os.getpid()}\n')
        return real_build(*args, **kwargs)

    line_index_module.build_line_index = recording_build
    ensure_line_index(ann, index_path, 'lines', progress=False)


def test_one_process_builds_while_the_others_wait(tmp_path):
    ann = _write(tmp_path / 'ann.txt', b''.join(
        b'dir/img_%07d.jpg %d\n' % (i, i % 7) for i in range(200_000)))
    log = str(tmp_path / 'builds.log')
    ctx = multiprocessing.get_context('fork')
    procs = [
        ctx.Process(target=_build_in_child, args=(ann, ann + '.idx', log))
        for _ in range(4)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0
    with open(log) as f:
        assert len(f.read().split()) == 1
    assert LineIndex(ann + '.idx').num_samples == 200_000
    assert sorted(os.listdir(tmp_path)) == ['ann.txt', 'ann.txt.idx',
                                            'builds.log']


@pytest.mark.parametrize('data, error, match', [
    (b'', AnnotationFormatError, 'no sample lines'),
    (b'\n \n\r\n', AnnotationFormatError, 'no sample lines'),
    (b'a.jpg 1\n\nb.jpg x\n', AnnotationFormatError,
     r'ann\.txt:3: expected "relative/path label"'),
    (b'a.jpg 1\nb\xff.jpg 2\n', AnnotationFormatError,
     r'ann\.txt:2: line is not valid UTF-8'),
])
def test_bad_files_name_the_problem_and_leave_no_index(tmp_path, data, error,
                                                       match):
    ann = _write(tmp_path / 'ann.txt', data)
    with pytest.raises(error, match=match):
        ensure_line_index(ann, ann + '.idx', 'lines')
    assert os.listdir(tmp_path) == ['ann.txt']


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match='nope.txt'):
        ensure_line_index(
            str(tmp_path / 'nope.txt'), str(tmp_path / 'i.idx'), 'lines')


def test_jsonl_metainfo_first_line_is_not_a_sample(tmp_path):
    ann = _write(tmp_path / 'a.jsonl',
                 b'{"metainfo": {"classes": ["x"]}}\n\n{"img_path": "a"}\n')
    index = ensure_line_index(ann, ann + '.idx', 'jsonl')
    assert index.num_samples == 1
    assert index.header_record() == b'{"metainfo": {"classes": ["x"]}}'


def test_index_dir_for_read_only_folders(tmp_path, monkeypatch):
    ann = str(tmp_path / 'ann.txt')
    path = default_index_path(ann, str(tmp_path / 'cache'))
    assert osp.dirname(path) == str(tmp_path / 'cache')
    assert osp.basename(path).startswith('ann.txt.')
    monkeypatch.setenv('MMDATA_INDEX_DIR', str(tmp_path / 'env'))
    monkeypatch.setattr(os, 'access', lambda *args: False)
    assert osp.dirname(default_index_path(ann)) == str(tmp_path / 'env')


def _refuse_builds(*args, **kwargs):
    raise AssertionError('built a private index although a valid shared one '
                         'exists')


def test_valid_index_in_a_read_only_folder_is_used(tmp_path, monkeypatch):
    # The way an admin prepares a shared dataset: index it once, then make
    # the folder read-only for everyone.
    shared = tmp_path / 'shared'
    shared.mkdir()
    ann = _write(shared / 'ann.txt', LINES)
    build_line_index(ann, ann + '.idx', 'lines', progress=False)
    private = tmp_path / 'private'
    monkeypatch.setenv('MMDATA_INDEX_DIR', str(private))
    os.chmod(shared, 0o555)
    try:
        if line_index_module.folder_writable(str(shared)):
            # Running as root, where chmod does not stop writes: make the
            # writability probe see what an ordinary user sees. What is
            # asserted below (which index is opened, nothing is built or
            # written) does not depend on the permissions themselves.
            monkeypatch.setattr(line_index_module, 'folder_writable',
                                lambda folder: folder != str(shared))
        monkeypatch.setattr(line_index_module, 'build_line_index',
                            _refuse_builds)
        for index_dir in (None, str(private)):
            dataset = RankShardedDataset(
                ann_file=ann, index_dir=index_dir, index_progress=False)
            assert dataset._index.path == ann + '.idx'
            assert dataset.get_data_info(1)['gt_label'] == 22
        assert not private.exists()
    finally:
        os.chmod(shared, 0o755)


def test_index_next_to_its_file_serves_it_at_another_mount_point(
        tmp_path, monkeypatch):
    # NFS shares and bind mounts show one folder at other paths on other
    # machines: the index built beside the file at the admin's path is
    # judged by the file's identity, not by the path it recorded.
    import shutil
    admin = tmp_path / 'admin' / 'data'
    (admin / 'meta').mkdir(parents=True)
    ann = _write(admin / 'meta' / 'train.txt', LINES)
    build_line_index(ann, ann + '.idx', 'lines', progress=False)
    # copytree keeps the mtimes, as a second mount of the folder shows them.
    mounted = tmp_path / 'mnt' / 'data'
    shutil.copytree(admin, mounted)
    shutil.rmtree(admin)  # the admin's path does not exist on this machine
    meta = mounted / 'meta'
    moved_ann = str(meta / 'train.txt')
    monkeypatch.setenv('MMDATA_INDEX_DIR', str(tmp_path / 'private'))
    # Read-only as mounted (and as a non-root user sees it under root too).
    os.chmod(meta, 0o555)
    monkeypatch.setattr(line_index_module, 'folder_writable',
                        lambda folder: folder != str(meta))
    monkeypatch.setattr(line_index_module, 'build_line_index',
                        _refuse_builds)
    try:
        assert index_problem(moved_ann + '.idx', moved_ann, 'lines') is None
        dataset = RankShardedDataset(ann_file=moved_ann, index_progress=False)
        assert dataset._index.path == moved_ann + '.idx'
        assert dataset._index.ann_file == moved_ann
        assert dataset.get_data_info(3)['img_path'].endswith('last.jpg')
    finally:
        os.chmod(meta, 0o755)
    assert not (tmp_path / 'private').exists()


def test_stale_index_in_a_read_only_folder_is_rebuilt_privately(
        tmp_path, monkeypatch):
    shared = tmp_path / 'shared'
    shared.mkdir()
    ann = _write(shared / 'ann.txt', LINES)
    build_line_index(ann, ann + '.idx', 'lines', progress=False)
    with open(ann, 'ab') as f:
        f.write(b'\nmore.jpg 5\n')  # the shared index is stale now
    shared_index = (shared / 'ann.txt.idx').read_bytes()
    monkeypatch.setattr(line_index_module, 'folder_writable',
                        lambda folder: folder != str(shared))
    logged = []
    monkeypatch.setattr(line_index_module, 'print_log',
                        lambda msg, **kwargs: logged.append(msg))
    dataset = RankShardedDataset(
        ann_file=ann, index_dir=str(tmp_path / 'private'),
        index_progress=False)
    assert osp.dirname(dataset._index.path) == str(tmp_path / 'private')
    assert len(dataset) == 5
    assert (shared / 'ann.txt.idx').read_bytes() == shared_index
    assert any(msg.startswith(f'Not using {ann}.idx: the annotation file '
                              'changed') for msg in logged)
    # on_stale_index='error' refuses it there too, before any private build.
    with pytest.raises(StaleIndexError, match='on_stale_index="rebuild"'):
        RankShardedDataset(ann_file=ann, index_dir=str(tmp_path / 'other'),
                           on_stale_index='error', index_progress=False)
    assert not (tmp_path / 'other').exists()


def test_progress_bar_reports_rate_and_eta(capsys, monkeypatch):
    bar = ByteProgressBar(100, 'indexing x', True)
    bar.start -= 20  # as if 20 s had passed: a log line is due
    bar.last -= 20
    bar.update(50)
    err = capsys.readouterr().err
    assert 'indexing x:' in err and '50.0%' in err and 'ETA' in err


def test_line_number_is_not_counted_far_into_the_file(tmp_path, monkeypatch):
    # Error messages must not make a worker scan a huge file: beyond the
    # limit the caller reports the record and byte offset instead.
    monkeypatch.setattr(line_index_module, '_LINE_COUNT_LIMIT', 10)
    ann = _write(tmp_path / 'ann.txt', LINES)
    index = ensure_line_index(ann, ann + '.idx', 'lines')
    assert index.line_number(0) == 1
    assert index.line_number(3) is None


def test_index_built_before_byte_order_marks_were_skipped_is_stale(tmp_path):
    ann = _write(tmp_path / 'ann.txt', b'\xef\xbb\xbfa.jpg 1\n')
    index = ensure_line_index(ann, ann + '.idx', 'lines')
    assert index.read(0) == b'a.jpg 1\n'
    header = dict(index.header)
    del header['data_start']  # as written before: the mark was in line 1
    with open(ann + '.idx', 'r+b') as f:
        f.write(b'MMDLIDX1' + json.dumps(header).encode().ljust(4088, b'\0'))
    assert 'byte-order mark' in index_problem(ann + '.idx', ann, 'lines')
