"""Importing the package registers every component; each builds by name."""
import copy
import functools

import pytest
from mmengine.registry import (DATA_SAMPLERS, DATASETS, FUNCTIONS, HOOKS,
                               LOOPS, METRICS, MODELS, OPTIM_WRAPPERS,
                               TRANSFORMS, Registry)

import mmdata_plugin  # noqa: F401

ROOT_REGISTRIES = dict(
    LOOPS=LOOPS,
    HOOKS=HOOKS,
    DATASETS=DATASETS,
    DATA_SAMPLERS=DATA_SAMPLERS,
    TRANSFORMS=TRANSFORMS,
    MODELS=MODELS,
    METRICS=METRICS,
    OPTIM_WRAPPERS=OPTIM_WRAPPERS,
    FUNCTIONS=FUNCTIONS,
)


def _loop_args():
    """A DataLoader and the little a train loop reads from its runner."""
    from types import SimpleNamespace

    from torch.utils.data import DataLoader
    runner = SimpleNamespace(
        visualizer=SimpleNamespace(dataset_meta=None),
        seed=0,
        _randomness_cfg={},
        hooks=[])
    runner.register_hook = runner.hooks.append
    return dict(runner=runner, dataloader=DataLoader(range(8), batch_size=2))


def _builders(demo_root, tmp_path):
    """How to build each registered name: (registry, cfg, default_args).

    Every component the package registers must appear here, so that a new
    one cannot ship without a build test.
    """
    import os.path as osp

    import torch

    from mmdata_plugin.datasets import (TarShardDataset,
                                        pack_image_list_litdata,
                                        pack_image_list_mds)
    from mmdata_plugin.datasets.tar_shard_writer import pack_image_list

    # Packed apart from the shared demo set, which other tests read.
    tar_root = str(tmp_path)
    pack_image_list(
        osp.join(demo_root, 'val.txt'), demo_root,
        osp.join(tar_root, 'tar'), 'val', samples_per_shard=16)
    tar_cfg = dict(data_root=tar_root, shards='tar/val-*.tar', ann_ext='cls')
    pack_image_list_mds(
        osp.join(demo_root, 'val.txt'), demo_root,
        osp.join(tar_root, 'mds'), samples_per_shard=16)
    pack_image_list_litdata(
        osp.join(demo_root, 'val.txt'), demo_root,
        osp.join(tar_root, 'litdata'), samples_per_chunk=16)
    return {
        ('MODELS', 'TinyCNNClassifier'): (dict(num_classes=3), {}),
        ('DATASETS', 'ImageListDataset'):
        (dict(data_root=demo_root, ann_file='val.txt'), {}),
        ('DATASETS', 'RankShardedDataset'):
        (dict(data_root=demo_root, ann_file='val.txt'), {}),
        ('DATASETS', 'TarShardDataset'):
        (tar_cfg, {}),
        ('DATASETS', 'MDSShardDataset'):
        (dict(data_root=tar_root, index='mds/index.json',
              label_column='label'), {}),
        ('DATASETS', 'LitDataChunkDataset'):
        (dict(data_root=tar_root, index='litdata/index.json',
              label_column='label'), {}),
        ('DATA_SAMPLERS', 'RankShardedSampler'):
        (dict(mini_epochs=2), dict(dataset=range(8), seed=0)),
        ('DATA_SAMPLERS', 'RankShardedInfiniteSampler'):
        (dict(), dict(dataset=range(8), seed=0)),
        ('DATA_SAMPLERS', 'GrowingWindowSampler'):
        (dict(initial=2, growth=2, capacity=4), dict(dataset=range(8),
                                                     seed=0)),
        ('DATA_SAMPLERS', 'ShardWindowSampler'):
        (dict(window_shards=2), dict(dataset=TarShardDataset(**tar_cfg),
                                     seed=0)),
        ('TRANSFORMS', 'RandomImageCrop'): (dict(crop_size=8), {}),
        ('TRANSFORMS', 'PackImageLabelInputs'): (dict(), {}),
        ('TRANSFORMS', 'LoadNumpyFromFile'):
        (dict(dtype='float32', shape=(-1, 3)), {}),
        ('TRANSFORMS', 'LoadImageFromFileReduced'):
        (dict(scale=(64, 4096), keep_ratio=True), {}),
        ('TRANSFORMS', 'ReducedDecodePipeline'): (dict(transforms=[
            dict(type='LoadImageFromFile'),
            dict(type='Resize', scale=(64, 4096), keep_ratio=True)
        ]), {}),
        # cache_dir: $MMDATA_CACHE_DIR, a temporary one (conftest.py)
        ('TRANSFORMS', 'CachedPipelineHead'): (dict(
            transforms=[dict(type='LoadImageFromFile')], cache_limit='1MB'),
                                               {}),
        ('METRICS', 'SingleLabelAccuracy'): (dict(), {}),
        ('DATASETS', 'SampleSeededDataset'): (dict(
            dataset=dict(
                type='ImageListDataset', data_root=demo_root,
                ann_file='val.txt')), {}),
        ('HOOKS', 'FastResumeHook'): (dict(), {}),
        ('LOOPS', 'FastResumeIterBasedTrainLoop'):
        (dict(max_iters=2), _loop_args()),
        ('LOOPS', 'FastResumeEpochBasedTrainLoop'):
        (dict(max_epochs=1), _loop_args()),
        ('HOOKS', 'DataMonitorHook'): (dict(interval=10), {}),
        ('HOOKS', 'DeviceFeedHook'): (dict(device='cpu'), {}),
        # Ray is needed from before_train on: this builds without it.
        ('HOOKS', 'RayDataNodesHook'):
        (dict(num_actors=2, address='auto', resources=dict(data_node=1)),
         {}),
        # A function: built as mmengine's Runner builds a collate_fn.
        ('FUNCTIONS', 'block_collate'):
        (dict(collate='default_collate'),
         dict(data_batch=[dict(inputs=torch.ones(2))] * 3)),
        ('HOOKS', 'RemoteCachePrefetchHook'): (dict(cache_limit='1MB'), {}),
        ('OPTIM_WRAPPERS', 'CPUAutocastOptimWrapper'):
        (dict(optimizer=torch.optim.SGD(torch.nn.Linear(2, 2).parameters(),
                                        lr=0.1)), {}),
    }


def _our_registered_names():
    names = set()
    for reg_name, registry in ROOT_REGISTRIES.items():
        for name, obj in registry.module_dict.items():
            if getattr(obj, '__module__', '').startswith('mmdata_plugin'):
                names.add((reg_name, name))
    return names


def test_every_registered_name_builds_from_config(demo_root, tmp_path):
    builders = _builders(demo_root, tmp_path)
    assert _our_registered_names() == set(builders), (
        'a component is registered without a build test, or the other way')
    for (reg_name, name), (cfg, default_args) in builders.items():
        registry = ROOT_REGISTRIES[reg_name]
        if registry is FUNCTIONS:
            collate = functools.partial(registry.get(name), **cfg)
            assert collate(**default_args)['inputs'].shape == (3, 2)
            continue
        obj = registry.build(
            dict(type=name, **copy.copy(cfg)), default_args=default_args)
        assert type(obj).__name__ == name


@pytest.mark.parametrize('reg_name', sorted(ROOT_REGISTRIES))
def test_downstream_scoped_registry_finds_our_components(reg_name):
    root = ROOT_REGISTRIES[reg_name]
    child = Registry(
        f'mmdet_like_{reg_name.lower()}', parent=root, scope='mmdet_like')
    for name, obj in root.module_dict.items():
        if getattr(obj, '__module__', '').startswith('mmdata_plugin'):
            assert child.get(name) is obj


def test_custom_imports_in_config_registers(tmp_path):
    from mmengine.config import Config
    cfg_file = tmp_path / 'cfg.py'
    cfg_file.write_text("custom_imports = dict(imports=['mmdata_plugin'])\n"
                        "model = dict(type='TinyCNNClassifier', "
                        "num_classes=2)\n")
    cfg = Config.fromfile(str(cfg_file))
    assert MODELS.build(cfg.model).head.out_features == 2
