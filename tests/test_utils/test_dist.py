"""Unit side of the CPU distributed helpers (the 2-rank run is in
tests/test_tools/test_train_script.py)."""
from mmengine.config import Config

from mmdata_plugin.testing import spawn_gloo
from mmdata_plugin.utils.dist import cpu_model_wrapper_cfg


def test_default_wrapper_gets_no_device_ids():
    cfg = Config(dict(find_unused_parameters=True))
    wrapper = cpu_model_wrapper_cfg(cfg)
    assert wrapper['type'] == 'MMDistributedDataParallel'
    assert wrapper['device_ids'] is None
    assert wrapper['find_unused_parameters'] is True


def test_user_wrapper_keeps_its_settings():
    cfg = Config(
        dict(
            model_wrapper_cfg=dict(
                type='MMDistributedDataParallel', broadcast_buffers=True)))
    wrapper = cpu_model_wrapper_cfg(cfg)
    assert wrapper['broadcast_buffers'] is True
    assert wrapper['device_ids'] is None


def _all_reduce_ranks(rank, world_size):
    import torch
    import torch.distributed as dist
    value = torch.tensor([rank + 1])
    dist.all_reduce(value)
    assert value.item() == world_size * (world_size + 1) // 2


def test_spawn_gloo_helper_runs_collectives():
    spawn_gloo(_all_reduce_ranks, world_size=2)
