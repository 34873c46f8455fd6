"""A batch whose sample crashes every actor that makes it is given up,
naming its indices, instead of replacing actors forever."""
import os

import pytest

pytest.importorskip(
    'ray', reason='Ray is not installed: pip install "mmdata_plugin[ray]" '
    '(the tests extra installs it)')

from monitor_helpers import CrashingDataset, sleepy_pipeline, train  # noqa

from mmdata_plugin.data_nodes.ray_batch_stream import \
    MAX_DEATHS_PER_BATCH  # noqa: E402
from ray_runs import ON_DATA_NODES  # noqa: E402


def test_a_batch_that_kills_its_actors_is_given_up_naming_it(
        cluster, tmp_path):
    dataset = CrashingDataset(
        crash_at=5, spared_pid=os.getpid(), num=8,
        pipeline=sleepy_pipeline((), 8))
    message = (rf'{MAX_DEATHS_PER_BATCH} data actors died making the batch '
               r'of indices \[[^]]*\b5\b')
    with pytest.raises(RuntimeError, match=message):
        # No local worker starts (the stock loop's early iterator would
        # start them, and one would load the sample).
        train(tmp_path, monitor=False, dataset=dataset,
              train_cfg=dict(type='FastResumeIterBasedTrainLoop',
                             max_iters=4),
              custom_hooks=[
                  dict(type='RayDataNodesHook', num_actors=1,
                       **ON_DATA_NODES)
              ])
