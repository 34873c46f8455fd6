"""Put a train DataLoader at a checkpoint's data position, loading nothing."""
import logging
import time
from typing import NamedTuple, Optional

from mmengine.logging import print_log
from torch.utils.data import DataLoader, IterableDataset

from ...datasets.sample_seeded_dataset import SampleSeededDataset
from ...sample_order.batch_order import (STRATEGY_DESCRIPTIONS, BatchOrder,
                                        batches_into_epoch)
from ...sample_order.data_position import (FORMAT_VERSION,
                                           SAMPLE_LEVEL_STRATEGIES,
                                           DataPosition, DataPositionError,
                                           check_compatible)
from ...sample_order.stream_settings import dataloader_stream_settings
from ...utils.dataloader_slots import rebind_dataloader_attribute
from .resumable_batch_sampler import ResumableBatchSampler


class ResumeReport(NamedTuple):
    """What :meth:`DataStreamResumer.resume` did, for the log line.

    ``strategy`` is how the position was reached: the resumer's strategy,
    or ``'stream_replay'`` when a stock checkpoint's position had to be
    found by replaying the stream's indices from the start.
    """
    skipped_batches: int
    skipped_samples: Optional[int]
    epoch: int
    batches_in_epoch: int
    samples_in_epoch: int
    strategy: str
    seconds: float
    drop_batches: int


class DataStreamResumer:
    """Positions the train data stream of a fast-resume loop.

    On construction it installs, before any DataLoader iterator exists, a
    :class:`SampleSeededDataset` around the dataset (``seed_per_sample``)
    and a :class:`ResumableBatchSampler` in the batch-sampler slot. It
    describes the position as plain data for checkpoints and, on resume,
    restores the sampler seed, asks the stream's
    :class:`~mmdata_plugin.sample_order.BatchOrder` for the saved position
    (or the one implied by the iteration of a stock checkpoint) and moves
    the batch sampler there.

    Args:
        dataloader (DataLoader): The train dataloader.
        seed (int): Seed of the run (identical on all ranks), used when the
            sampler has no ``seed`` of its own.
        seed_per_sample (bool): Seed each sample's augmentations from its
            stream position.
    """

    def __init__(self,
                 dataloader: DataLoader,
                 seed: int,
                 seed_per_sample: bool = True) -> None:
        if getattr(dataloader, 'in_order', True) is False:
            raise ValueError(
                'train_dataloader has in_order=False: batches then arrive in '
                'the order workers finish them, which no resume can replay. '
                'Use in_order=True with the fast-resume loops.')
        self.dataloader = dataloader
        self.order: Optional[BatchOrder] = None
        self._saved: Optional[dict] = None
        self._meta_seed: Optional[int] = None
        self._fallback_seed = seed
        if (dataloader.batch_sampler is None
                or isinstance(dataloader.dataset, IterableDataset)):
            self.batch_sampler = None
            self.position = DataPosition(None)
            return
        if seed_per_sample and not isinstance(dataloader.dataset,
                                              SampleSeededDataset):
            # No DataLoader iterator exists yet (the loops create theirs
            # lazily), so nothing reads the old pieces afterwards.
            rebind_dataloader_attribute(
                dataloader, 'dataset', SampleSeededDataset(dataloader.dataset))
        self.position = DataPosition(None)
        self.batch_sampler = ResumableBatchSampler(
            dataloader.batch_sampler, self.position, seed, seed_per_sample)
        self.order = self.batch_sampler.order
        self.position.samples_per_batch = self.order.samples_per_batch
        rebind_dataloader_attribute(dataloader, 'batch_sampler',
                                    self.batch_sampler)
        # A setting checkpoints cannot store fails here, not at the first
        # checkpoint hours later.
        self.facts()

    @property
    def strategy(self) -> str:
        """How the stream is positioned (see ``choose_strategy``)."""
        if self.order is None:
            return 'load_and_drop'
        return self.order.strategy

    @property
    def seed(self) -> int:
        """Seed of the sampler order and of the per-sample seeds."""
        if self.order is None:
            return self._fallback_seed
        return self.order.seed

    def facts(self) -> dict:
        """What a saved position is only valid for (plain data)."""
        if self.order is None:
            sampler, batch_sampler = None, self.dataloader.batch_sampler
            world_size = None
        else:
            sampler = self.order.sampler
            batch_sampler = self.order.batch_sampler
            world_size = self.order.world_size
        dataset = self.dataloader.dataset
        return dict(
            strategy=self.strategy,
            sampler=type(sampler).__name__ if sampler is not None else None,
            batch_sampler=type(batch_sampler).__name__,
            dataset_size=len(dataset) if hasattr(dataset, '__len__') else
            None,
            shuffle=getattr(sampler, 'shuffle', None),
            stream_settings=dataloader_stream_settings(
                sampler, batch_sampler),
            world_size=world_size,
            batch_size=getattr(batch_sampler, 'batch_size', None))

    def state_dict(self) -> dict:
        """The current position, for checkpoints (plain data)."""
        return dict(
            format=FORMAT_VERSION,
            seed=self.seed,
            **self.facts(),
            **self.position.as_dict())

    def load_checkpoint_meta(self, meta: dict) -> None:
        """Keep what a loaded checkpoint says about the data (all ranks)."""
        self._saved = meta.get('data_position')
        self._meta_seed = meta.get('seed')

    def resume(self,
               iteration: int,
               epoch: Optional[int] = None,
               diff_rank_seed: bool = False) -> Optional[ResumeReport]:
        """Position the stream for a run that continues at ``iteration``.

        Args:
            iteration (int): Iterations already done (the loop's ``_iter``).
            epoch (int, optional): The epoch the epoch-based loop is about to
                run; None for iteration-based training.
            diff_rank_seed (bool): ``randomness.diff_rank_seed``: a stock
                checkpoint then lacks the sampler seed.

        Returns:
            ResumeReport | None: None for a run that starts from scratch
            (``load_from`` included).
        """
        start = time.perf_counter()
        if iteration == 0:
            self._move_to(0, epoch or 0, 0, 0, 0)
            return None
        if self._saved is not None:
            target = self._from_saved(self._saved, iteration, epoch)
        else:
            target = self._from_stock_checkpoint(iteration, epoch,
                                                 diff_rank_seed)
        strategy, drop = self.strategy, 0
        if self.batch_sampler is None:
            # Nothing to position: the loop loads and drops from the start
            # of the stream (iteration-based) or of the epoch.
            drop = iteration if epoch is None else target[2]
            self.position.move_to(iteration - drop, epoch or 0, 0)
        elif target is not None:
            self._move_to(*target)
        else:
            # A stock checkpoint, and a sampler that does not say whether
            # it ends: its stream was replayed from the start.
            strategy = 'stream_replay'
        position = self.position
        if epoch is None:
            skipped = (iteration, position.consumed_samples)
        else:
            skipped = (position.batches_in_epoch, position.samples_in_epoch)
        if not position.samples_per_batch:
            skipped = (skipped[0], None)
        return ResumeReport(*skipped, position.epoch,
                            position.batches_in_epoch,
                            position.samples_in_epoch, strategy,
                            time.perf_counter() - start, drop)

    def _move_to(self, iteration: int, epoch: int, batches: int,
                 samples: int, consumed: int) -> None:
        self.position.move_to(iteration, epoch, batches, samples, consumed)
        if self.batch_sampler is not None:
            self.batch_sampler.seek(epoch, samples, batches)

    def _use_seed(self, seed: Optional[int], source: str) -> None:
        if self.order is None:
            self._fallback_seed = seed
            return
        if seed is not None and seed != self.order.seed:
            print_log(
                f'Fast resume: the sampler seed {seed} from the {source} '
                f'replaces {self.order.seed}, which was chosen before '
                'the checkpoint was read.',
                logger='current')
            self.order.set_seed(seed)

    def _from_saved(self, saved: dict, iteration: int,
                    epoch: Optional[int]) -> tuple:
        check_compatible(saved, self.facts())
        if saved.get('iter') != iteration:
            raise DataPositionError(
                f'The checkpoint\'s data position is for iteration '
                f'{saved.get("iter")!r} but the runner resumed at iteration '
                f'{iteration} (meta.iter).')
        if epoch is not None and saved['epoch'] != epoch:
            raise DataPositionError(
                f'The checkpoint\'s data position is in epoch '
                f'{saved["epoch"]!r} but the runner resumed at epoch {epoch} '
                '(meta.epoch).')
        self._use_seed(saved['seed'], 'checkpoint')
        samples = saved['samples_in_epoch']
        batches = saved['batches_in_epoch']
        if (self.strategy in SAMPLE_LEVEL_STRATEGIES
                and self.position.samples_per_batch !=
                saved['batch_size'] * saved['world_size']):
            # A world or batch size change: the global sample count is what
            # carries over; batches are counted in the new size.
            print_log(
                f'Fast resume: world_size x batch_size changed from '
                f'{saved["world_size"]} x {saved["batch_size"]} to '
                f'{self.order.world_size} x '
                f'{self.batch_sampler.batch_size}; the sample stream '
                f'continues at global sample {samples} of epoch '
                f'{saved["epoch"]}.',
                logger='current')
            batches = samples // self.position.samples_per_batch
        return (iteration, saved['epoch'], batches, samples,
                saved['consumed_samples'])

    def _from_stock_checkpoint(self, iteration: int, epoch: Optional[int],
                               diff_rank_seed: bool) -> Optional[tuple]:
        sampler = getattr(self.order, 'sampler', None)
        if diff_rank_seed and hasattr(sampler, 'seed'):
            print_log(
                'Fast resume: the checkpoint has no data position and was '
                'written with randomness.diff_rank_seed=True, so the seed '
                'its sampler drew is unknown; the resumed run follows a new '
                'order. Checkpoints saved by the fast-resume loops record '
                'it.',
                logger='current',
                level=logging.WARNING)
        else:
            self._use_seed(self._meta_seed, 'checkpoint meta')
        per_batch = self.position.samples_per_batch or 0
        consumed = iteration * per_batch
        if self.order is None:
            if epoch is None:
                return None
            batches = batches_into_epoch(iteration, epoch, self.dataloader)
            return (iteration, epoch, batches, 0, consumed)
        found = self.order.position_after(iteration, epoch)
        if found is None:
            # Whether the sampler ever ends an epoch is unknown: replay it.
            epoch, batches = self.batch_sampler.replay(iteration, 0)
            self.position.move_to(iteration, epoch, batches,
                                  batches * per_batch, consumed)
            return None
        epoch, batches = found
        return (iteration, epoch, batches, batches * per_batch, consumed)


def describe(report: ResumeReport) -> str:
    """The log line of a fast resume."""
    where = (f'epoch {report.epoch}, batch {report.batches_in_epoch} of the '
             'epoch')
    if report.strategy in SAMPLE_LEVEL_STRATEGIES:
        where += f', global sample {report.samples_in_epoch} of the epoch'
    skipped = f'{report.skipped_batches} batches'
    if report.skipped_samples is not None:
        skipped += f' ({report.skipped_samples} samples on all ranks)'
    return (f'Fast resume: skipped {skipped} without loading any sample, '
            f'by {STRATEGY_DESCRIPTIONS[report.strategy]}, in '
            f'{report.seconds * 1000:.2f} ms; the data stream continues at '
            f'{where}.')
