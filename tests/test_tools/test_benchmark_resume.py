"""tools/benchmark_resume.py resumes from real checkpoints by the fast path.

Its children run in-process here (one sampler, no workers); the tool itself
refuses to report a fast-resume figure that was not positioned directly.
"""

import pytest
from helpers import load_tool


@pytest.mark.parametrize('writer',
                         ['FastResumeIterBasedTrainLoop', 'IterBasedTrainLoop'])
def test_resumes_real_checkpoints_without_replay(tmp_path, demo_root,
                                                 monkeypatch, writer):
    monkeypatch.setenv('MMDATA_DEMO_ROOT', demo_root)
    tool = load_tool('benchmark_resume')
    setting = dict(
        sampler='RankShardedInfiniteSampler',
        iters=300,
        work_dir=str(tmp_path / 'work'),
        batch_size=4,
        num_workers=0)
    checkpoint = str(tmp_path / 'iter_300.pth')
    tool.write_checkpoints(
        dict(setting, loop=writer, checkpoints={'300': checkpoint}))
    result = tool.measure(dict(setting, loop=tool.OURS, checkpoint=checkpoint))
    # Our own checkpoint carries the data position; a stock one is
    # positioned from meta.iter -- both by fast_forward, not by replay.
    assert result['data_position'] == (writer == tool.OURS)
    assert result['strategy'] == 'fast_forward'
    assert 'positioning' in result
