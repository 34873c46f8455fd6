"""Where the train data stream stands, as plain data for checkpoints."""
from typing import Optional

#: Version of the ``meta['data_position']`` layout written to checkpoints.
FORMAT_VERSION = 1

#: Strategies whose position is a global sample count, so that the world
#: size and the batch size may change between the runs.
SAMPLE_LEVEL_STRATEGIES = ('infinite', 'default', 'fast_forward')


class DataPositionError(ValueError):
    """A checkpoint's data position cannot be honoured by this run."""


class DataPosition:
    """The position of the train data stream, advanced once per batch.

    ``iteration`` counts the batches handed to the training step in all
    (it equals ``meta.iter`` of a checkpoint saved now), ``batches_in_epoch``
    those of the sampler's current epoch, and ``samples_in_epoch`` the
    samples of that epoch across all ranks (for an infinite sampler: from
    the start of its stream).

    Args:
        samples_per_batch (int, optional): ``batch_size * world_size``;
            None when batches have no fixed size (custom batch samplers),
            in which case only batches are counted.
    """

    def __init__(self, samples_per_batch: Optional[int]) -> None:
        self.samples_per_batch = samples_per_batch
        self.iteration = 0
        self.epoch = 0
        self.batches_in_epoch = 0
        self.samples_in_epoch = 0
        self.consumed_samples = 0

    def move_to(self,
                iteration: int,
                epoch: int,
                batches_in_epoch: int,
                samples_in_epoch: int = 0,
                consumed_samples: int = 0) -> None:
        """Jump to a position (on resume)."""
        self.iteration = iteration
        self.epoch = epoch
        self.batches_in_epoch = batches_in_epoch
        self.samples_in_epoch = samples_in_epoch
        self.consumed_samples = consumed_samples

    def start_epoch(self, epoch: int) -> None:
        """The sampler begins epoch ``epoch`` from its first sample."""
        self.move_to(self.iteration, epoch, 0, 0, self.consumed_samples)

    def advance(self) -> None:
        """One batch was handed to the training step."""
        self.iteration += 1
        self.batches_in_epoch += 1
        if self.samples_per_batch:
            # The last batch of an epoch may be short; the count then runs
            # past the epoch's end, which resumes into the next epoch.
            self.samples_in_epoch += self.samples_per_batch
            self.consumed_samples += self.samples_per_batch

    def as_dict(self) -> dict:
        return dict(
            iter=self.iteration,
            epoch=self.epoch,
            batches_in_epoch=self.batches_in_epoch,
            samples_in_epoch=self.samples_in_epoch,
            consumed_samples=self.consumed_samples)


def _mismatch(key: str, saved: dict, current: dict) -> str:
    return (f'The checkpoint\'s data position cannot be resumed: {key} is '
            f'{saved.get(key)!r} in the checkpoint but '
            f'{current.get(key)!r} in this run')


def check_compatible(saved: dict, current: dict) -> None:
    """Raise :class:`DataPositionError` if ``saved`` cannot be resumed here.

    Args:
        saved (dict): ``meta['data_position']`` of the checkpoint.
        current (dict): The same facts about this run's train dataloader.
    """
    version = saved.get('format')
    if version != FORMAT_VERSION:
        raise DataPositionError(
            f'The checkpoint\'s data_position has format {version!r}, this '
            f'mmdata_plugin reads format {FORMAT_VERSION}.')
    for key, where in (('sampler', 'train_dataloader.sampler'),
                       ('batch_sampler', 'train_dataloader.batch_sampler'),
                       ('strategy', 'train_dataloader'),
                       ('dataset_size', 'train_dataloader.dataset'),
                       ('shuffle', 'train_dataloader.sampler.shuffle')):
        if saved.get(key) != current.get(key):
            raise DataPositionError(
                f'{_mismatch(key, saved, current)} ({where}). The saved '
                'position only means something for the same sampler over '
                'the same dataset.')
    _check_stream_settings(saved, current)
    if current['strategy'] in SAMPLE_LEVEL_STRATEGIES:
        return
    for key in ('world_size', 'batch_size'):
        if saved.get(key) != current.get(key):
            raise DataPositionError(
                f'{_mismatch(key, saved, current)}. Strategy '
                f'{current["strategy"]!r} (sampler '
                f'{current["sampler"]}, batch sampler '
                f'{current["batch_sampler"]}) replays each rank\'s own batches '
                'and cannot re-split the sample stream. Resume with the '
                f'same {key}, or use a sampler the loop can position by '
                'global sample count (InfiniteSampler, DefaultSampler, or one '
                'with fast_forward()) under a plain batch sampler.')


def _check_stream_settings(saved: dict, current: dict) -> None:
    # Checkpoints written before the settings were recorded lack them.
    before = saved.get('stream_settings')
    if before is None:
        return
    now = current['stream_settings']
    for key in sorted(set(before) | set(now)):
        if before.get(key) != now.get(key):
            raise DataPositionError(
                'The checkpoint\'s data position cannot be resumed: '
                f'train_dataloader.{key} is {before.get(key)!r} in the '
                f'checkpoint but {now.get(key)!r} in this run. It defines '
                'the sample stream, so the saved position would continue a '
                f'different stream; resume with train_dataloader.{key}='
                f'{before.get(key)!r}.')
