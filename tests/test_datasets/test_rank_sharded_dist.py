"""Two real ranks (torchrun, gloo) with DataLoader workers: coverage,
padding, mini-epochs, persistent workers, shard files, stock samplers."""
import json
import os.path as osp

from helpers import REPO_ROOT

from mmdata_plugin.testing import cpu_env, python_path, run_ranks

SCRIPT = osp.join(osp.dirname(__file__), 'rank_sharded_dist_script.py')


def test_two_ranks_cover_every_sample_each_epoch(tmp_path):
    ann = tmp_path / 'ann.txt'
    ann.write_text(''.join(f'dir/img_{i:07d}.jpg {i % 7}\n'
                           for i in range(101)))
    out = tmp_path / 'summary.json'
    run_ranks(
        SCRIPT, [str(ann), str(out)],
        nproc=2,
        env=cpu_env(dict(PYTHONPATH=python_path(REPO_ROOT))),
        timeout=300)
    summary = json.loads(out.read_text())
    assert summary['epochs']['per_rank'] == 51  # ceil(101 / 2)
    assert summary['mini_epochs']['per_rank'] == 17  # ceil(ceil(101/3)/2)
    assert summary['mini_epochs']['epochs'] == 6
    assert summary['mini_epochs+shards']['epochs'] == 6
    assert summary['DefaultSampler']['per_rank'] == 51
    assert summary['infinite']['samples'] == 320
    assert summary['infinite+shards']['samples'] == 320
