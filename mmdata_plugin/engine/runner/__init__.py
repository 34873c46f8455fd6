from .data_position import DataPosition, DataPositionError
from .data_stream_resumer import DataStreamResumer
from .fast_resume_loops import (FastResumeEpochBasedTrainLoop,
                                FastResumeIterBasedTrainLoop)
from .resumable_batch_sampler import ResumableBatchSampler, choose_strategy
from .resumable_iterator import ResumableDataloaderIterator

__all__ = [
    'DataPosition', 'DataPositionError', 'DataStreamResumer',
    'FastResumeEpochBasedTrainLoop', 'FastResumeIterBasedTrainLoop',
    'ResumableBatchSampler', 'choose_strategy', 'ResumableDataloaderIterator'
]
