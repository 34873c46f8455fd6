"""ShardWindowSampler in the fast-resume loops: in-process runs from a
config, resumed mid-epoch onto the same batches."""
import pytest
from fast_resume_toys import ToyDataset, make_runner, recorder_of

# 23 toy samples in 5 shards; windows of 2 shards.
SHARD_SIZES = [5, 3, 7, 4, 4]
SAMPLER = dict(type='ShardWindowSampler', window_shards=2)


class ToyShards(ToyDataset):

    def shard_sizes(self):
        return SHARD_SIZES


@pytest.mark.parametrize('loop, checkpoint', [
    (dict(type='FastResumeEpochBasedTrainLoop', max_epochs=3), 'iter_4.pth'),
    (dict(type='FastResumeIterBasedTrainLoop', max_iters=14), 'iter_8.pth'),
])
def test_resumed_run_reads_the_same_batches(tmp_path, loop, checkpoint):
    # 6 batches per epoch (the last of 3): iter_4 is inside epoch 0,
    # iter_8 inside epoch 1.

    def train(name, resume_from=None):
        work_dir = tmp_path / name
        work_dir.mkdir()
        runner = make_runner(
            work_dir, loop, sampler=SAMPLER, dataset=ToyShards(),
            resume_from=resume_from)
        runner.train()
        return recorder_of(runner), work_dir

    full, work_dir = train('full')
    epoch = [i for it in full.iterations[:6] for i in it['index']]
    assert sorted(epoch) == list(range(23))
    resumed, _ = train('resumed', str(work_dir / checkpoint))
    assert resumed.iterations == full.iterations[int(checkpoint[5:-4]):]
