"""Two jobs fed by Ray data actors share the pipeline heads they decode.

The heads a ``CachedPipelineHead`` makes on a data node go into that
node's store (its ``cache_dir``); a second job with the same dataset and
head, whose actors run on the same nodes, reads them back instead of
decoding again. On the loopback cluster every node is this machine, so
the store is one directory; on a real cluster it is one per data node.
"""
import os

import pytest

pytest.importorskip(
    'ray', reason='Ray is not installed: pip install "mmdata_plugin[ray]" '
    '(the tests extra installs it)')

from ray_runs import ON_DATA_NODES  # noqa: E402
from monitor_helpers import train  # noqa: E402

from mmdata_plugin.cache import NodeStore  # noqa: E402
from mmdata_plugin.utils import camera_like_image, encode_jpeg  # noqa: E402

IMAGES = 12
ITERS = 8
BATCH = 2


def _image_list(folder) -> str:
    os.makedirs(folder / 'images')
    lines = []
    for i in range(IMAGES):
        with open(folder / 'images' / f'{i}.jpg', 'wb') as f:
            f.write(encode_jpeg(camera_like_image(64, 48, seed=i)))
        lines.append(f'images/{i}.jpg {i % 3}\n')
    with open(folder / 'train.txt', 'w') as f:
        f.writelines(lines)
    return str(folder)


def _job(work_dir, data_root, cache_dir):
    head = dict(type='CachedPipelineHead', cache_dir=cache_dir,
                cache_limit='50MB', transforms=[
                    dict(type='LoadImageFromFile'),
                    dict(type='Resize', scale=(32, 24), keep_ratio=False)])
    dataset = dict(type='ImageListDataset', data_root=data_root,
                   ann_file='train.txt', pipeline=[
                       head,
                       dict(type='RandomImageCrop', crop_size=8),
                       dict(type='PackImageLabelInputs')])
    return train(work_dir, monitor=False, dataset=dataset,
                 train_cfg=dict(type='FastResumeIterBasedTrainLoop',
                                max_iters=ITERS),
                 custom_hooks=[dict(type='RayDataNodesHook', num_actors=2,
                                    **ON_DATA_NODES)])


def test_a_second_job_reads_the_heads_the_first_one_decoded(
        cluster, tmp_path):
    data_root = _image_list(tmp_path / 'data')
    cache_dir = str(tmp_path / 'node_cache')
    first = _job(tmp_path / 'first', data_root, cache_dir)
    made = NodeStore(cache_dir, '50MB').counters('head')
    # The actors decoded each image once, then read it back (they also make
    # the batches in flight when training ends: more reads than trained).
    assert made['produced'] == IMAGES
    assert made['hits'] >= ITERS * BATCH - IMAGES

    second = _job(tmp_path / 'second', data_root, cache_dir)
    shared = NodeStore(cache_dir, '50MB').counters('head')
    assert shared['produced'] == made['produced'], 'decoded again'
    assert shared['hits'] - made['hits'] >= ITERS * BATCH
    assert second.model.seen == first.model.seen
