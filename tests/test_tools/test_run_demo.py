"""The README's main job, shrunk: train, SIGKILL after a checkpoint, resume."""
import os.path as osp

from helpers import REPO_ROOT, quick_cfg_options

from mmdata_plugin.testing import run_script


def test_run_demo_kills_and_resumes(tmp_path, demo_root, train_env):
    work_dir = tmp_path / 'work'
    out = run_script(osp.join(REPO_ROOT, 'tools', 'run_demo.py'), [
        '--data-root', demo_root,
        '--work-dir',
        str(work_dir), '--kill-after', 'iter_4.pth'
    ] + quick_cfg_options(max_iters=8, interval=4),
                      env=train_env).stdout
    assert 'Training killed (exit code -9)' in out
    assert 'resumed epoch: 0, iter: 4' in out
    assert osp.isfile(work_dir / 'iter_8.pth')
    assert f'work dir     : {work_dir}' in out
    scalars = [line.split(': ', 1)[1] for line in out.splitlines()
               if line.startswith('  scalars      : ')]
    assert scalars  # one per run that logged scalars
    assert all(osp.isfile(path) and path.endswith(
        osp.join('vis_data', 'scalars.json')) for path in scalars)
    assert 'val top-1' in out
    # the resumed run read the train pipeline's head from the node cache
    assert 'Head cache (CachedPipelineHead, node store ' in out
