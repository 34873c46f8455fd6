"""Constants and small helpers shared by the tests (fixtures: conftest.py)."""
import importlib.util
import os
import os.path as osp
import time

from mmdata_plugin.cache.head_sources import PRODUCING_SECONDS

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DEMO_CONFIG = osp.join(REPO_ROOT, 'configs', 'demo', 'tinycnn_demo-jpeg.py')
TRAIN_SCRIPT = osp.join(REPO_ROOT, 'tools', 'train.py')


def quick_cfg_options(max_iters=6, interval=3, **extra):
    """--cfg-options that shrink the demo config to a few iterations."""
    options = dict({
        'train_cfg.max_iters': max_iters,
        'train_cfg.val_interval': max_iters,
        'default_hooks.checkpoint.interval': interval,
        'default_hooks.logger.interval': 1,
        'train_dataloader.batch_size': 4,
        'val_dataloader.batch_size': 8,
    }, **extra)
    return ['--cfg-options'] + [f'{k}={v}' for k, v in options.items()]


def load_tool(name: str):
    """``tools/<name>.py`` as a module (tools are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(
        name, osp.join(REPO_ROOT, 'tools', f'{name}.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def age_head_link(sources, source: str, seconds: float = None) -> None:
    """Make a ``HeadSources`` link look recorded ``seconds`` ago (past
    the while a link to an entry not on disk yet counts, by default)."""
    then = time.time() - (PRODUCING_SECONDS + 1 if seconds is None else
                          seconds)
    os.utime(sources.link_path(source), (then, then), follow_symlinks=False)
