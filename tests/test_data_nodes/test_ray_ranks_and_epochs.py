"""RayDataNodesHook with two gloo ranks, a world-size change and the
epoch-based fast-resume loop, on a loopback Ray cluster of three nodes
(conftest.py): the batches are bitwise those of local DataLoader workers.
"""
import json

import pytest

pytest.importorskip(
    'ray', reason='Ray is not installed: pip install "mmdata_plugin[ray]" '
    '(the tests extra installs it)')

from monitor_helpers import SleepyDataset, sleepy_pipeline  # noqa: E402
from ray_runs import (ON_DATA_NODES, train_probed,  # noqa: E402
                      train_ranks)
from resume_probe import records, samples_by_position  # noqa: E402

from mmdata_plugin.testing import spawn_gloo  # noqa: E402

BATCH = 2  # per rank (monitor_helpers.train)
RANK_ITERS = 8


def _iter_loop(max_iters):
    return dict(type='FastResumeIterBasedTrainLoop', max_iters=max_iters)


@pytest.fixture(scope='module')
def two_ranks(cluster, tmp_path_factory):
    """Two gloo ranks train 8 iterations with one local worker each, then
    again fed by one Ray actor each (both on the module's cluster)."""
    root = tmp_path_factory.mktemp('two_ranks')
    common = dict(train_cfg=_iter_loop(RANK_ITERS), num_workers=1)
    ray_hook = dict(address=cluster.address, num_actors=1, **ON_DATA_NODES)
    spawn_gloo(train_ranks, world_size=2, args=([
        (str(root / 'local'), None, common),
        (str(root / 'ray'), ray_hook, common),
    ], ))
    return root


def test_two_ranks_fed_by_ray_get_the_batches_of_local_workers(two_ranks):
    for rank in (0, 1):
        ray_fed = records(two_ranks / 'ray', rank)
        assert sorted(ray_fed) == list(range(RANK_ITERS))
        # Indices, augmented pixels and the (all-reduced) loss.
        assert ray_fed == records(two_ranks / 'local', rank)
    actors = [
        json.loads((two_ranks / 'ray' / f'actors_rank{rank}.json').read_text())
        for rank in (0, 1)
    ]
    pids = [pid for fed in actors for pid in fed['actor_pids']]
    assert len(set(pids)) == 2
    assert not set(pids) & {fed['rank_pid'] for fed in actors}


def test_a_two_rank_checkpoint_resumes_on_one_rank_fed_by_ray(
        cluster, two_ranks, tmp_path):
    # docs/fast_resume.md: InfiniteSampler's global stream does not depend
    # on the world size; the resumed run continues it at the first
    # position nobody trained on, each position with its sample and its
    # augmented pixels.
    train_probed(tmp_path, dict(num_actors=2, **ON_DATA_NODES),
                 train_cfg=_iter_loop(12), resume=True,
                 load_from=str(two_ranks / 'ray' / 'iter_4.pth'))
    trained = 4 * BATCH * 2
    after = samples_by_position(tmp_path, 1, BATCH, first_iter=4,
                                start=trained)
    assert sorted(after) == list(range(trained, RANK_ITERS * BATCH * 2))
    reference = samples_by_position(two_ranks / 'local', 2, BATCH)
    assert after == {p: reference[p] for p in after}


EPOCHS = dict(type='FastResumeEpochBasedTrainLoop', max_epochs=2)


def _train_epochs(work_dir, ray_hook=None, **kwargs):
    """Two epochs of 6 iterations (12 samples, DefaultSampler shuffled)."""
    dataset = SleepyDataset(num=12, pipeline=sleepy_pipeline((0.5, 0.5), 8))
    return train_probed(work_dir, ray_hook, loop='epoch', train_cfg=EPOCHS,
                        dataset=dataset, **kwargs).model.seen


def test_the_epoch_loop_fed_by_ray_gives_the_local_stream_and_resumes(
        cluster, tmp_path):
    local = _train_epochs(tmp_path / 'local')
    assert len(local) == 12
    assert _train_epochs(tmp_path / 'ray',
                         dict(num_actors=1, **ON_DATA_NODES)) == local
    # iter_4.pth is mid-epoch 0: the resumed run ends that epoch and
    # trains the next.
    resumed = _train_epochs(
        tmp_path / 'ray', dict(num_actors=1, **ON_DATA_NODES), resume=True,
        load_from=str(tmp_path / 'ray' / 'iter_4.pth'))
    assert resumed == local[4:]


def test_a_one_rank_checkpoint_resumes_on_two_ranks_fed_by_ray(
        cluster, two_ranks, tmp_path):
    # The other way round: 4 iterations on one rank (8 positions), then
    # two ranks fed by Ray continue the global stream from position 8,
    # rank r taking positions 8 + r, 10 + r, ...
    ray_hook = dict(address=cluster.address, num_actors=1, **ON_DATA_NODES)
    train_probed(tmp_path / 'one', ray_hook, train_cfg=_iter_loop(4))
    spawn_gloo(train_ranks, world_size=2, args=([
        (str(tmp_path / 'two'), ray_hook,
         dict(train_cfg=_iter_loop(8), resume=True,
              load_from=str(tmp_path / 'one' / 'iter_4.pth'))),
    ], ))
    trained = 4 * BATCH
    after = samples_by_position(tmp_path / 'two', 2, BATCH, first_iter=4,
                                start=trained)
    assert sorted(after) == list(range(trained, trained + 4 * BATCH * 2))
    reference = samples_by_position(two_ranks / 'local', 2, BATCH)
    assert after == {p: reference[p] for p in after}
