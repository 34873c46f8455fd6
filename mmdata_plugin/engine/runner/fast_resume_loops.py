"""Train loops that resume in O(1) and replay the data stream exactly."""
import itertools
import logging
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

from mmengine.dist import get_rank
from mmengine.logging import print_log
from mmengine.registry import LOOPS
from mmengine.runner import EpochBasedTrainLoop, IterBasedTrainLoop
from mmengine.runner.base_loop import BaseLoop
from mmengine.runner.utils import calc_dynamic_intervals
from torch.utils.data import DataLoader

from ...datasets.rank_sharded_sampler import stock_sampler_advice
from ...utils.seeding import mix_seed, seed_global_rngs
from ...utils.torch_internals import (decide_val_interval, diff_rank_seed,
                                      set_loop_counters)
from ..hooks.fast_resume_hook import FastResumeHook
from .data_stream_resumer import DataStreamResumer, describe
from .resumable_iterator import (ResumableDataloaderIterator,
                                 new_dataloader_iterator)

# Label of the main process's per-iteration seeds; sample seeds start with
# an epoch (>= 0) instead, so the two families never meet.
_MAIN_PROCESS_STREAM = -1


def _base_seed(runner) -> int:
    """The run's seed before mmengine adds the rank (``diff_rank_seed``)."""
    if diff_rank_seed(runner):
        return runner.seed - get_rank()
    return runner.seed


class _FastResumeMixin:
    """What both fast-resume loops add to mmengine's loops."""

    def _setup_fast_resume(self, seed_per_sample: bool,
                           seed_per_iter: bool) -> None:
        self.seed_per_iter = seed_per_iter
        # What the last resume did (None for a fresh start), for monitors.
        self.resume_report = None
        stock_sampler_advice(self.dataloader)
        self.data_resumer = DataStreamResumer(self.dataloader,
                                              _base_seed(self.runner),
                                              seed_per_sample)
        hook = next((hook for hook in self.runner.hooks
                     if isinstance(hook, FastResumeHook)), None)
        if hook is None:
            hook = FastResumeHook()
            self.runner.register_hook(hook)
        hook.bind(self)

    def data_position(self) -> dict:
        """The data position to save in a checkpoint now (plain data)."""
        return self.data_resumer.state_dict()

    def load_checkpoint_meta(self, meta: dict) -> None:
        """Called by :class:`FastResumeHook` when a checkpoint is loaded."""
        self.data_resumer.load_checkpoint_meta(meta)

    def _fast_forward(self, epoch: Optional[int] = None) -> int:
        """Position the data stream at ``self.iter``.

        Returns:
            int: Batches the loop must still load and drop (only for
            streams that cannot be positioned).
        """
        report = self.data_resumer.resume(
            self.iter, epoch, diff_rank_seed(self.runner))
        self.resume_report = report
        if report is None:
            return 0
        if report.drop_batches:
            print_log(
                f'Fast resume is impossible here: the train dataset '
                f'({type(self.dataloader.dataset).__name__}) is an '
                'IterableDataset (or the DataLoader has no batch sampler), '
                'which cannot be positioned by index. Loading and dropping '
                f'{report.drop_batches} batches instead, like stock '
                'mmengine; this takes as long as reading them did.',
                logger='current',
                level=logging.WARNING)
        else:
            print_log(describe(report), logger='current')
        return report.drop_batches

    def _seed_iteration(self) -> None:
        # Main-process randomness (batch augmentations in the data
        # preprocessor, dropout, ...) becomes a function of the iteration,
        # so a resumed run draws what the uninterrupted one drew.
        if self.seed_per_iter:
            seed_global_rngs(
                mix_seed(self.runner.seed, _MAIN_PROCESS_STREAM, self.iter),
                all_devices=True)


@LOOPS.register_module()
class FastResumeIterBasedTrainLoop(_FastResumeMixin, IterBasedTrainLoop):
    """``IterBasedTrainLoop`` whose resume costs index arithmetic only.

    A drop-in for mmengine's loop (same arguments, hooks, validation
    schedule, dynamic intervals, ``stop_training``). On resume at iteration
    N it does not load the N skipped batches: the sampler is moved to the
    saved position before the DataLoader iterator -- and so any worker --
    exists. The batches that follow are those an uninterrupted run of this
    loop yields: same indices and, with ``seed_per_sample``, the same
    augmented values for pipelines that draw from ``random``,
    ``numpy.random`` or torch's global generator, for any ``num_workers``,
    ``persistent_workers`` and ``prefetch_factor`` (also changed between
    the runs). The position is a global sample count, so the world size and
    the batch size may change between the runs (mmengine samplers and
    samplers with ``fast_forward``).

    How the stream is positioned, by sampler:

    * ``InfiniteSampler`` / ``DefaultSampler`` (and subclasses that keep
      their index generation): arithmetic on their permutations.
    * A sampler with ``fast_forward(global_offset: int) -> None``: it is
      called so that its next ``__iter__`` (one-shot) starts at position
      ``global_offset`` of the global sample stream, counted in samples
      across all ranks -- within the epoch chosen by the last ``set_epoch``
      for an epoch-based sampler, since the start of the stream for an
      infinite one. Its ``seed`` attribute (int, identical on all ranks) is
      saved and restored.
    * Any other sampler, or a custom batch sampler (e.g. aspect-ratio
      bucketing): its indices (batches) are replayed without loading data.
    * An ``IterableDataset`` cannot be positioned: its batches are loaded
      and dropped as in mmengine, with a warning.

    The data position is saved in ``meta['data_position']`` by a
    :class:`FastResumeHook` that the loop registers. A stock checkpoint
    resumes from the position its ``meta.iter`` implies; its sampler seed
    is taken from ``meta.seed`` (mmengine builds the sampler with a fresh
    seed before reading the checkpoint when ``randomness.seed`` is None).

    Args:
        runner (Runner): A reference of runner.
        dataloader (Dataloader or dict): A dataloader object or a dict to
            build a dataloader.
        max_iters (int): Total training iterations.
        val_begin (int): The iteration that begins validating.
            Defaults to 1.
        val_interval (int): Validation interval. Defaults to 1000.
        dynamic_intervals (List[Tuple[int, int]], optional): The first
            element in the tuple is a milestone and the second element is
            an interval. The interval is used after the corresponding
            milestone. Defaults to None.
        seed_per_sample (bool): Wrap the dataset in
            :class:`~mmdata_plugin.datasets.SampleSeededDataset` and seed
            each sample from its stream position, so that random
            augmentations replay exactly. Defaults to True.
        seed_per_iter (bool): Reseed the main process's ``random``,
            ``numpy.random`` and torch generators (all devices) at each
            iteration from ``(seed, iteration)``, so that randomness in the
            training step replays exactly too. Defaults to True.
    """

    def __init__(self,
                 runner,
                 dataloader: Union[DataLoader, Dict],
                 max_iters: int,
                 val_begin: int = 1,
                 val_interval: int = 1000,
                 dynamic_intervals: Optional[List[Tuple[int, int]]] = None,
                 seed_per_sample: bool = True,
                 seed_per_iter: bool = True) -> None:
        # IterBasedTrainLoop.__init__ ends with `iter(dataloader)`, which
        # starts the workers and dispatches batches before the checkpoint is
        # even read; so only BaseLoop.__init__ runs and the same attributes
        # are set here.
        BaseLoop.__init__(self, runner, dataloader)
        set_loop_counters(
            self, max_iters=int(max_iters), max_epochs=1, epoch=0, iter=0)
        assert self.max_iters == max_iters, \
            f'`max_iters` should be a integer number, but get {max_iters}'
        self.val_begin = val_begin
        self.val_interval = val_interval
        self.stop_training = False
        if hasattr(self.dataloader.dataset, 'metainfo'):
            self.runner.visualizer.dataset_meta = \
                self.dataloader.dataset.metainfo
        else:
            print_log(
                f'Dataset {self.dataloader.dataset.__class__.__name__} has no '
                'metainfo. ``dataset_meta`` in visualizer will be None.',
                logger='current',
                level=logging.WARNING)
        self.dynamic_milestones, self.dynamic_intervals = \
            calc_dynamic_intervals(self.val_interval, dynamic_intervals)
        self._setup_fast_resume(seed_per_sample, seed_per_iter)
        # Created once; hooks may wrap it in `before_train`. It only calls
        # `iter(dataloader)` at its first `next()`, after positioning.
        self._resumable_iterator = ResumableDataloaderIterator(
            self.dataloader, self.data_resumer.position)
        self.dataloader_iterator = self._resumable_iterator

    def run(self) -> None:
        """Launch training."""
        self.runner.call_hook('before_train')
        # In iteration-based training loop, we treat the whole training
        # process as a big epoch and execute the corresponding hook.
        self.runner.call_hook('before_train_epoch')
        if self._resumable_iterator.started:
            raise RuntimeError(
                'loop.dataloader_iterator was read before the loop positioned '
                'the data stream; hooks must not take batches from it before '
                '`before_train_iter`.')
        for _ in range(self._fast_forward()):
            next(self.dataloader_iterator)
        while self.iter < self.max_iters and not self.stop_training:
            self.runner.model.train()
            self._seed_iteration()
            data_batch = next(self.dataloader_iterator)
            self.run_iter(data_batch)

            decide_val_interval(self)
            if (self.runner.val_loop is not None
                    and self.iter >= self.val_begin
                    and (self.iter % self.val_interval == 0
                         or self.iter == self.max_iters)):
                self.runner.val_loop.run()

        self.runner.call_hook('after_train_epoch')
        self.runner.call_hook('after_train')
        return self.runner.model


@LOOPS.register_module()
class FastResumeEpochBasedTrainLoop(_FastResumeMixin, EpochBasedTrainLoop):
    """``EpochBasedTrainLoop`` that resumes mid-epoch, exactly and in O(1).

    A drop-in for mmengine's loop. Resumed from a checkpoint saved by
    iteration in the middle of an epoch (``CheckpointHook(by_epoch=False)``),
    it continues that epoch after the last trained batch -- mmengine replays
    the epoch from its first batch -- without loading the skipped samples;
    ``after_train_epoch`` (validation, epoch checkpoints) still runs once the
    epoch's remaining batches are done. Positioning, the exactness
    guarantee, ``seed_per_sample`` and ``seed_per_iter`` are those of
    :class:`FastResumeIterBasedTrainLoop`. The sampler's epoch is set by the
    loop at each epoch start (as ``DistSamplerSeedHook`` does).

    Args:
        runner (Runner): A reference of runner.
        dataloader (Dataloader or dict): A dataloader object or a dict to
            build a dataloader.
        max_epochs (int): Total training epochs.
        val_begin (int): The epoch that begins validating. Defaults to 1.
        val_interval (int): Validation interval. Defaults to 1.
        dynamic_intervals (List[Tuple[int, int]], optional): The first
            element in the tuple is a milestone and the second element is
            an interval. The interval is used after the corresponding
            milestone. Defaults to None.
        seed_per_sample (bool): See :class:`FastResumeIterBasedTrainLoop`.
            Defaults to True.
        seed_per_iter (bool): See :class:`FastResumeIterBasedTrainLoop`.
            Defaults to True.
    """

    def __init__(self,
                 runner,
                 dataloader: Union[DataLoader, Dict],
                 max_epochs: int,
                 val_begin: int = 1,
                 val_interval: int = 1,
                 dynamic_intervals: Optional[List[Tuple[int, int]]] = None,
                 seed_per_sample: bool = True,
                 seed_per_iter: bool = True) -> None:
        super().__init__(runner, dataloader, max_epochs, val_begin,
                         val_interval, dynamic_intervals)
        self._setup_fast_resume(seed_per_sample, seed_per_iter)
        self._positioned = False

    def run_epoch(self) -> None:
        """Iterate one epoch (the rest of it, right after a resume)."""
        self.runner.call_hook('before_train_epoch')
        first, drop = self._enter_epoch()
        self.runner.model.train()
        for idx, data_batch in self._epoch_batches(first, drop):
            self.run_iter(idx, data_batch)
        # A checkpoint saved from here on (by epoch) starts the next epoch.
        self.data_resumer.position.start_epoch(self.epoch + 1)
        self.runner.call_hook('after_train_epoch')
        set_loop_counters(self, epoch=self.epoch + 1)

    def _enter_epoch(self) -> Tuple[int, int]:
        """Index of the epoch's first batch to train, and batches to drop."""
        position = self.data_resumer.position
        if self._positioned:
            position.start_epoch(self.epoch)
            return 0, 0
        self._positioned = True
        drop = self._fast_forward(self.epoch)
        return position.batches_in_epoch + drop, drop

    def _epoch_batches(self, first: int,
                       drop: int) -> Iterator[Tuple[int, Sequence[dict]]]:
        position = self.data_resumer.position
        iterator = new_dataloader_iterator(self.dataloader)
        for _ in range(drop):
            next(iterator)
            position.advance()
        for idx in itertools.count(first):
            self._seed_iteration()
            try:
                data_batch = next(iterator)
            except StopIteration:
                return
            position.advance()
            yield idx, data_batch
