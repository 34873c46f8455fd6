import json
import runpy
import sys
import tracemalloc

import pytest

from mmdata_plugin.datasets import AnnotationFormatError, RankShardedDataset
from mmdata_plugin.datasets import jsonl_conversion
from mmdata_plugin.datasets.jsonl_conversion import \
    convert_openmmlab_json_to_jsonl
from helpers import REPO_ROOT

RECORDS = [
    dict(img_path=f'dir {i}/img.jpg', gt_label=i % 5, note='é\n"x"',
         instances=[dict(bbox=[1.5, 2, 3e-3, 4], bbox_label=i)])
    for i in range(300)
]


def _read_jsonl(path):
    with open(path, encoding='utf-8') as f:
        return [json.loads(line) for line in f]


@pytest.mark.parametrize('metainfo_first', [True, False])
def test_round_trip_in_small_blocks(tmp_path, monkeypatch, metainfo_first):
    # 256-character blocks: records and numbers are cut at block ends.
    monkeypatch.setattr(jsonl_conversion, '_BLOCK', 256)
    metainfo = dict(classes=['a', 'b', 'c', 'd', 'e'], dataset_type='x')
    parts = [('metainfo', metainfo), ('data_list', RECORDS), ('version', 1)]
    if not metainfo_first:
        parts.reverse()
    src, dst = tmp_path / 'ann.json', tmp_path / 'ann.jsonl'
    src.write_text(json.dumps(dict(parts), indent=2, ensure_ascii=False),
                   encoding='utf-8')
    result = convert_openmmlab_json_to_jsonl(str(src), str(dst))
    assert result == dict(num_samples=300, metainfo=True)
    assert _read_jsonl(dst) == [dict(metainfo=metainfo)] + RECORDS
    assert sorted(p.name for p in tmp_path.iterdir()) == ['ann.json',
                                                           'ann.jsonl']
    dataset = RankShardedDataset(
        ann_file=str(dst), data_prefix=dict(img_path='/data'))
    assert len(dataset) == 300
    assert dataset.metainfo == metainfo
    assert dataset.get_data_info(7)['img_path'] == '/data/dir 7/img.jpg'


def test_memory_is_bounded_by_the_block_not_the_file(tmp_path, monkeypatch):
    monkeypatch.setattr(jsonl_conversion, '_BLOCK', 32 << 10)
    src, dst = tmp_path / 'big.json', tmp_path / 'big.jsonl'
    records = ",\n".join(json.dumps(r) for r in RECORDS * 80)
    src.write_text(f'{{"metainfo": {{}}, "data_list": [{records}]}}')
    assert src.stat().st_size > 3 << 20
    tracemalloc.start()
    try:
        convert_openmmlab_json_to_jsonl(str(src), str(dst), progress=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 512 << 10, f'peak {peak / 2**20:.1f} MiB'
    assert len(_read_jsonl(dst)) == 1 + 300 * 80


def test_an_early_syntax_error_is_raised_without_reading_on(
        tmp_path, monkeypatch):
    # A bad record in the first block of a big file: raised there, not
    # after the rest of the file was read into memory.
    monkeypatch.setattr(jsonl_conversion, '_BLOCK', 32 << 10)
    src = tmp_path / 'ann.json'
    records = ",\n".join(json.dumps(r) for r in RECORDS * 80)
    src.write_text('{"data_list": [{"gt_label": 0 oops},\n' + records + ']}')
    tracemalloc.start()
    try:
        with pytest.raises(AnnotationFormatError, match=r'ann\.json:1:31'):
            convert_openmmlab_json_to_jsonl(str(src), str(tmp_path / 'o'),
                                            progress=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 512 << 10, f'peak {peak / 2**20:.1f} MiB'


@pytest.mark.parametrize('text, match', [
    ('{"data_list": [{"a": 1}, {"a": 2,}]}', r'ann\.json:1:34: invalid JSON'),
    ('{"data_list": [{"a": 1},\n 3]}',
     r'ann\.json:2:2: data_list\[1\] is a int'),
    ('{"data_list": [{"a": 1}]', r'ann\.json:1:25: expected "," or "}"'),
    ('{"data_list": []} extra', 'unexpected data after'),
    ('[{"a": 1}]', 'expected the top-level object'),
    ('{"metainfo": {}}', 'no "data_list"'),
    ('{"metainfo": 3, "data_list": []}', '"metainfo" must be an object'),
    (b'{"data_list": [{"a": "\xff"}]}', 'not valid UTF-8'),
])
def test_bad_json_names_file_and_position(tmp_path, text, match):
    src = tmp_path / 'ann.json'
    src.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(AnnotationFormatError, match=match):
        convert_openmmlab_json_to_jsonl(str(src), str(tmp_path / 'o.jsonl'))
    assert [p.name for p in tmp_path.iterdir()] == ['ann.json']


def _run_tool(name, monkeypatch, *args):
    monkeypatch.setattr(sys, 'argv', [name, *map(str, args)])
    runpy.run_path(f'{REPO_ROOT}/tools/{name}', run_name='__main__')


def test_tools_convert_and_index(tmp_path, monkeypatch, capsys):
    src, dst = tmp_path / 'a.json', tmp_path / 'a.jsonl'
    src.write_text(json.dumps(dict(data_list=RECORDS[:3])))
    _run_tool('convert_annotations_to_jsonl.py', monkeypatch, src, dst)
    assert f'{dst}: 3 samples' in capsys.readouterr().out
    _run_tool('build_annotation_index.py', monkeypatch, dst)
    assert '3 samples in 3 lines' in capsys.readouterr().out
    with pytest.raises(SystemExit) as up_to_date:
        _run_tool('build_annotation_index.py', monkeypatch, dst, '--check')
    assert up_to_date.value.code == 0
    with open(dst, 'a') as f:
        f.write('{"img_path": "new.jpg"}\n')
    with pytest.raises(SystemExit) as stale:
        _run_tool('build_annotation_index.py', monkeypatch, dst, '--check')
    assert stale.value.code == 1
    assert 'the annotation file changed' in capsys.readouterr().out
