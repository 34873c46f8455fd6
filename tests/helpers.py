"""Constants and small helpers shared by the tests (fixtures: conftest.py)."""
import contextlib
import importlib.util
import os
import os.path as osp
import threading
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


def train_packed_demo(config: str, packed_root: str, train_env: dict,
                      work_dir: str) -> str:
    """``tools/train.py`` on a packed-data demo config for 4 iterations,
    its data root ``packed_root`` (the shards only: the demo's loose
    images are not where the config looks); its output, once it has saved
    a checkpoint and validated."""
    from mmdata_plugin.testing import run_script
    env = dict(train_env, MMDATA_DEMO_ROOT=str(packed_root))
    out = run_script(TRAIN_SCRIPT, [
        config, '--work-dir',
        str(work_dir), *quick_cfg_options(max_iters=4, interval=4)
    ], env=env).stdout
    assert 'Saving checkpoint at 4 iterations' in out
    assert 'cls/top1' in out
    return out


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


@contextlib.contextmanager
def key_locked_elsewhere(store, digest: str):
    """Hold the store's single-flight lock of ``digest`` on another thread
    (another producer, as a reader's download is) until the block ends."""
    taken, release = threading.Event(), threading.Event()

    def hold():
        with store._key_lock(digest) as locked:
            assert locked
            taken.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert taken.wait(30)
        yield
    finally:
        release.set()
        holder.join(30)
