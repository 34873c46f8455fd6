"""Make mmengine's distributed launchers work on CPU-only machines.

mmengine 0.10.7 is GPU-minded: ``init_dist`` calls ``torch.cuda.set_device``
before creating the process group, and ``Runner.wrap_model`` passes
``device_ids=[LOCAL_RANK]`` to DistributedDataParallel, which torch rejects
for a model on the CPU. Both only need the right inputs, so instead of
patching mmengine we (1) create the gloo process group ourselves (mmengine
skips ``init_dist`` when a group exists) and (2) give the runner a
``model_wrapper_cfg`` with ``device_ids=None`` (explicit config values win
over the runner's default arguments).
"""
import datetime
import os
import subprocess

import torch
import torch.distributed as torch_dist
from mmengine.config import Config
from mmengine.logging import print_log
from mmengine.registry import MODEL_WRAPPERS
from torch.nn.parallel import DistributedDataParallel

_DEFAULT_PORT = '29500'


def _slurm_env() -> None:
    """Derive torch.distributed's env variables from SLURM's."""
    node_list = os.environ['SLURM_NODELIST']
    master = subprocess.getoutput(
        f'scontrol show hostname {node_list} | head -n1')
    os.environ.setdefault('MASTER_ADDR', master)
    os.environ.setdefault('MASTER_PORT', _DEFAULT_PORT)
    os.environ['WORLD_SIZE'] = os.environ['SLURM_NTASKS']
    os.environ['RANK'] = os.environ['SLURM_PROCID']
    os.environ['LOCAL_RANK'] = os.environ.get('SLURM_LOCALID', '0')


def init_cpu_process_group(launcher: str, timeout: int = 1800) -> None:
    """Create a gloo process group for ``launcher`` without touching CUDA.

    Args:
        launcher (str): ``'pytorch'`` (torchrun) or ``'slurm'``.
        timeout (int): Collective timeout in seconds.
    """
    if launcher == 'slurm':
        _slurm_env()
    elif launcher != 'pytorch':
        raise ValueError(
            f'launcher={launcher!r} is not supported on CPU; use "pytorch" '
            '(torchrun) or "slurm".')
    torch_dist.init_process_group(
        backend='gloo',
        rank=int(os.environ['RANK']),
        world_size=int(os.environ['WORLD_SIZE']),
        timeout=datetime.timedelta(seconds=timeout))


def cpu_model_wrapper_cfg(cfg: Config) -> dict:
    """The runner's DDP wrapper config, with ``device_ids`` unset for CPU."""
    wrapper_cfg = cfg.get('model_wrapper_cfg')
    if wrapper_cfg is None:
        wrapper_cfg = dict(
            type='MMDistributedDataParallel',
            broadcast_buffers=False,
            find_unused_parameters=cfg.get('find_unused_parameters', False))
    wrapper_cls = MODEL_WRAPPERS.get(wrapper_cfg['type'])
    if isinstance(wrapper_cls, type) and issubclass(wrapper_cls,
                                                    DistributedDataParallel):
        wrapper_cfg.setdefault('device_ids', None)
    return wrapper_cfg


def prepare_distributed(cfg: Config, launcher: str) -> None:
    """Adapt ``cfg`` (and the process group) so ``launcher`` works here.

    On machines with CUDA nothing changes: mmengine's own NCCL path is used.
    Without CUDA the backend becomes gloo, the process group is created here
    and the DDP wrapper gets ``device_ids=None``.

    Args:
        cfg (Config): The training config; modified in place.
        launcher (str): ``'none'``, ``'pytorch'`` or ``'slurm'``.
    """
    if launcher == 'none' or torch.cuda.is_available():
        return
    env_cfg = cfg.setdefault('env_cfg', {})
    dist_cfg = env_cfg.setdefault('dist_cfg', {})
    if dist_cfg.get('backend', 'nccl') != 'gloo':
        print_log(
            f'No CUDA device: using the gloo backend instead of '
            f'{dist_cfg.get("backend", "nccl")!r}.',
            logger='current')
    dist_cfg['backend'] = 'gloo'
    if not torch_dist.is_initialized():
        init_cpu_process_group(launcher, dist_cfg.get('timeout', 1800))
    cfg.model_wrapper_cfg = cpu_model_wrapper_cfg(cfg)
