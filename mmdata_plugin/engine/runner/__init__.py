from .data_stream_resumer import DataStreamResumer
from .fast_resume_loops import (FastResumeEpochBasedTrainLoop,
                                FastResumeIterBasedTrainLoop)
from .resumable_batch_sampler import ResumableBatchSampler
from .resumable_iterator import ResumableDataloaderIterator

__all__ = [
    'DataStreamResumer', 'FastResumeEpochBasedTrainLoop',
    'FastResumeIterBasedTrainLoop', 'ResumableBatchSampler',
    'ResumableDataloaderIterator'
]
