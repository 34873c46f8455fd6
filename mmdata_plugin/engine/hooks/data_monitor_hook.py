"""DataMonitorHook: where the data time of a training run goes."""
import logging
import math
import os
import os.path as osp
import time
from typing import Optional

import torch.distributed as torch_dist
from mmengine.config import Config
from mmengine.dist import all_gather_object, get_rank, get_world_size
from mmengine.hooks import Hook, LoggerHook
from mmengine.logging import HistoryBuffer, print_log
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS
from torch.utils.data import DataLoader

from mmdata_plugin.data_monitor import (DataLoaderMonitor, build_report,
                                        format_rank_table, format_report,
                                        format_worker_table, loader_context,
                                        plot_report, save_report)
from mmdata_plugin.data_monitor.head_cache import (add_head_cache,
                                                   read_head_cache)
from mmdata_plugin.data_monitor.loader_monitor import HAND_OVER_SECONDS
from mmdata_plugin.data_monitor.remote_cache import add_remote_cache
from mmdata_plugin.data_monitor.report_writer import ReportWriter
from mmdata_plugin.data_monitor.worker_timing import MonitoredBatch
from mmdata_plugin.utils.torch_internals import set_only_value

#: Environment variable read by :func:`apply_data_monitor_env`.
MONITOR_ENV = 'MMDATA_MONITOR'
#: Seconds a refresh's report may reuse the head cache's figures. Reading
#: them locks the node store's ledger (beside the workers that write it),
#: reclaims dead processes' counts and reads every process's counter file:
#: 5-9 ms at steady state, half a refresh's cost, where refreshes come
#: every ``table_min_seconds`` (30). The final report reads them afresh.
HEAD_CACHE_READ_EVERY = 60.0
#: Seconds a training step spends sending timeline points to the
#: visualizer (at least one point, whatever it costs). They come in
#: bursts, those of a whole hand-over booked at once on the writer's
#: thread (~300 at the demo's ``interval=10`` with 10 ms steps), and a
#: backend call costs 50-100 us warm, a millisecond cold
#: (``LocalVisBackend``: a deep copy of the scalars, an open and a close of
#: its JSON file): sent together they held one step up for tens of
#: milliseconds. A point takes ``interval`` (>= 1) counted steps to make,
#: so the queue drains between hand-overs, unless ``interval=1`` with a
#: backend slower than this: then the queue's oldest points beyond
#: ``max_timeline_points`` never reach the visualizer (the JSON keeps
#: them).
POINTS_SECONDS = 0.0005
#: What the hook puts into the log line (message hub keys).
LOG_SCALARS = ('train/dm_wait_time', 'train/dm_worker_time',
               'train/dm_input_bound')


@HOOKS.register_module()
class DataMonitorHook(Hook):
    """Measure and explain the data-loading time of training.

    Per batch and per DataLoader worker it times the file read, the image
    decode, every pipeline transform (by position and class, nested
    wrappers included), the dataset fetch as a whole (re-fetches counted),
    collate, and in the training process the wait for each batch and its
    transfer. It works with any loop that iterates the train DataLoader
    (stock ``IterBasedTrainLoop``/``EpochBasedTrainLoop`` and this
    package's loops), any ``num_workers``, persistent workers, pin_memory,
    fork and spawn workers and wrapped datasets. What the model receives is
    unchanged.

    Outputs: ``dm_wait_time``, ``dm_worker_time`` (seconds, means) and
    ``dm_input_bound`` (share of step time spent waiting) in the log line
    and every visualizer backend, over the counted steps of the logging
    interval only (none counted: not logged); per-stage and
    per-transform ms every ``interval`` steps to the visualizer; a
    per-worker table every ``table_interval`` iterations; at the end a
    summary with verdict and advice in the log, ``data_monitor.json`` and
    ``data_monitor.png`` in ``out_dir`` (the run's log dir by default).
    The books, the tables and the JSON file of ``table_interval`` are
    kept and made on a thread of their own: per step the training thread
    appends a row of numbers, and a refresh hands the rows not handed
    over yet to that thread (nothing is copied); it waits only when two
    refreshes are already pending. With fast steps they are spaced to about
    ``table_min_seconds``: a refresh costs a few milliseconds (10-20 on a
    virtual machine, whose caches and page tables have cooled since the
    last one), which every ``table_interval`` iterations of 10 ms steps
    would be several microseconds per sample for a table nobody reads
    every second. Files are replaced atomically: a run that is killed
    leaves the last complete report; a single process that ends on an
    error finishes the pending refreshes first (for up to 10 s).
    Warm-up steps and steps right after a restart of the loader, a
    validation or a checkpoint save are not counted. With several ranks the
    figures of all ranks are gathered and the worst rank is judged.

    Args:
        interval (int): Counted steps per point of the breakdown over time
            (sent to the visualizer). Defaults to 50.
        table_interval (int): Log a per-worker table (and refresh the JSON
            file) every this many iterations; 0 disables. Defaults to 500.
        table_min_seconds (float): Seconds aimed at between two
            refreshes: when the last ``table_interval`` iterations took
            less, the next refresh skips as many whole intervals as that
            rate says make this time (judged on rank 0's clock, so that
            every rank refreshes at the same iterations; a forecast, so a
            span slowed by a validation can bring the next one sooner). The
            first refresh comes at ``table_interval``. 0: every
            ``table_interval`` iterations. Defaults to 30.
        warmup_iters (int): Steps not counted at the start. Defaults to 10.
        settle_iters (int, optional): Steps not counted after a restart,
            validation or checkpoint. Defaults to the batches in flight
            (``prefetch_factor * num_workers``).
        per_transform (bool): Time each transform. Defaults to True.
        split_io_decode (bool): Separate file read and decode in mmcv's
            loading path. Defaults to True.
        out_dir (str, optional): Where the JSON and PNG go. Defaults to
            ``runner.log_dir`` (inside the work dir).
        plot (bool): Write the PNG at the end. Defaults to True.
        sample_every (int, optional): Time the stages of one batch in this
            many; None chooses from the measured cost (timing stays under
            0.2% of the worker time), 1 times every batch. Defaults to None.
    """

    priority = 'NORMAL'

    def __init__(self,
                 interval: int = 50,
                 table_interval: int = 500,
                 table_min_seconds: float = 30.0,
                 warmup_iters: int = 10,
                 settle_iters: Optional[int] = None,
                 per_transform: bool = True,
                 split_io_decode: bool = True,
                 out_dir: Optional[str] = None,
                 plot: bool = True,
                 sample_every: Optional[int] = None) -> None:
        if (interval < 1 or table_interval < 0
                or not 0 <= table_min_seconds < math.inf or warmup_iters < 0):
            raise ValueError(
                'DataMonitorHook needs interval >= 1, table_interval >= 0, '
                'a finite table_min_seconds >= 0 and warmup_iters >= 0, got '
                f'interval={interval}, table_interval={table_interval}, '
                f'table_min_seconds={table_min_seconds}, '
                f'warmup_iters={warmup_iters}')
        if sample_every is not None and sample_every < 1:
            raise ValueError('DataMonitorHook needs sample_every=None or >= '
                             f'1, got sample_every={sample_every}')
        self.interval = interval
        self.table_interval = table_interval
        self.table_min_seconds = table_min_seconds
        self.monitor_args = dict(
            warmup_iters=warmup_iters,
            settle_iters=settle_iters,
            per_transform=per_transform,
            split_io_decode=split_io_decode,
            timeline_every=interval,
            manual_steps=True,
            sample_every=sample_every)
        self.out_dir = out_dir
        self.plot = plot
        self.monitor: Optional[DataLoaderMonitor] = None
        self._logger: Optional[LoggerHook] = None
        # The message hub's buffers of LOG_SCALARS, one value each, reused.
        self._log_buffers: dict = {}
        self._loader_length: Optional[int] = None
        # _logger_logs's bounds: batch indices in between need no check.
        self._checked_index = -1
        self._next_check = 0
        # The train loop: its ``iter`` is runner.iter without the Runner's
        # properties (mmengine's Runner.iter reads its ``train_loop``
        # property twice and checks the loop against an abstract class three
        # times before the loop's ``iter``): 0.04 us a read warm instead of
        # 0.5, a few us less a step cold.
        self._loop = None
        # The loop's iter (runner.iter) of the step in progress, read once
        # in before_train_iter, reused in after_train_iter.
        self._iteration = 0
        # Whether the loop was judged blind (see _warn_if_blind): once.
        self._blind_checked = False
        self._preprocessor = None
        self._writer: Optional[ReportWriter] = None
        self._group = None
        self._rank: Optional[int] = None
        # Timeline points encoded by earlier writes (see encode_report).
        self._encoded: dict = {}
        # (time.monotonic() when read, summary) of the head cache.
        self._head_cache: Optional[tuple] = None
        self._run_context: dict = {}
        self._node_ranks = 1
        # The refreshes' spacing (see _space_refreshes): the iteration
        # count of the next one, and rank 0's (seconds since before_train,
        # iteration) at the last one, all set on the writer's thread.
        self._next_table = table_interval
        self._last_table = (0.0, -1)
        self._started = 0.0
        # Refreshes handed over, and those whose successor is decided.
        self._submitted = self._spaced = 0

    # ------------------------------------------------------------ train
    def before_train(self, runner) -> None:
        # (nothing of an earlier run's is stepped if this one is not
        # measured)
        self.monitor = self._loop = None
        loop = runner.train_loop
        loader = getattr(loop, 'dataloader', None)
        if not isinstance(loader, DataLoader):
            runner.logger.warning(
                'DataMonitorHook needs a torch DataLoader as '
                f'train_loop.dataloader, got {type(loader).__name__}; '
                'nothing is measured.')
            return
        self._logger = next(
            (h for h in runner.hooks if isinstance(h, LoggerHook)), None)
        self._forget_log_scalars(runner)
        self._log_buffers = {}
        self._loop = loop
        self.monitor = DataLoaderMonitor(loader, **self.monitor_args)
        self.monitor.install(loop=loop)
        if self._logger is not None:
            self.monitor.take_interval()  # starts counting the interval
        # At an exit without after_train, a rank's pending refreshes would
        # wait in their gathers on peers that may be gone: only a single
        # process finishes them.
        self._writer = ReportWriter(
            exit_timeout=10.0 if get_world_size() == 1 else 0.0)
        # The books (and the timeline's points) are kept on the writer's
        # thread: a step only appends a row, and a refresh copies nothing.
        # A refresh hands over the steps not booked yet: with refreshes
        # every ~table_min_seconds, hand-overs of their own would wake the
        # writer as often again, each time with cold caches (milliseconds
        # of CPU on a virtual machine); they only bound what waits when
        # refreshes are rarer (or steps faster than HAND_OVER_MOST in a
        # refresh spacing).
        self.monitor.book_on(
            self._writer.submit,
            seconds=max(HAND_OVER_SECONDS, 3 * self.table_min_seconds)
            if self.table_interval else HAND_OVER_SECONDS)
        # The writer gathers all ranks' figures beside training, whose own
        # collectives (DDP's all-reduce) use the default group: two
        # threads must not share a group.
        if get_world_size() > 1:
            self._group = torch_dist.new_group(backend='gloo')
        # A resumed run starts at runner.iter: the first spacing counts
        # the iterations from there.
        self._started = time.monotonic()
        # What every report reads of the run, which does not change: read
        # now, not in a refresh's snapshot (on a virtual machine, code and
        # data untouched since the last refresh cost milliseconds to reach
        # again, on the training thread).
        self._run_context = dict(
            dataset=loader.dataset,
            pipeline=runner.cfg.get('train_dataloader', {}).get(
                'dataset', {}).get('pipeline'))
        self._node_ranks = int(
            os.environ.get('LOCAL_WORLD_SIZE', get_world_size()))
        self._last_table = (0.0, runner.iter - 1)
        self._next_table = self.table_interval
        self._submitted = self._spaced = 0
        self._time_preprocessor(runner)
        pipelines = self.monitor.instrumentation.pipelines
        # RayDataNodesHook: the actors make the batches (their stages are
        # not timed), not the loader's workers.
        nodes = loader_context(loader)['data_nodes']
        timing = (f"{nodes['actors']} Ray data actor(s) (per batch)"
                  if nodes else f'{loader.num_workers} worker(s), '
                  f'{sum(len(p["transforms"]) for p in pipelines)} '
                  f'transform(s) in {len(pipelines)} pipeline(s)')
        runner.logger.info(
            f'DataMonitorHook: timing {timing}; report every '
            f'{self.table_interval or "-"} iterations (spaced to about '
            f'{self.table_min_seconds:g} s) and at the end.')

    def _time_preprocessor(self, runner) -> None:
        """Count the data preprocessor's host time as the training
        process's ``preprocess`` stage (moving, stacking, normalising the
        batch: data work, not the model's).

        An instance attribute shadows the class's ``forward`` for this model
        only (``nn.Module.__call__`` looks it up on the instance);
        after_train removes it.
        """
        model = runner.model.module if is_model_wrapper(
            runner.model) else runner.model
        preprocessor = getattr(model, 'data_preprocessor', None)
        if preprocessor is None or 'forward' in vars(preprocessor):
            return
        forward, monitor = preprocessor.forward, self.monitor

        def timed_forward(data, training=False, *args, **kwargs):
            if not training:  # validation's batches are not measured
                return forward(data, training, *args, **kwargs)
            start = time.perf_counter()
            result = forward(data, training, *args, **kwargs)
            monitor.add_trainer_stages(
                dict(preprocess=time.perf_counter() - start))
            return result

        preprocessor.forward = timed_forward
        self._preprocessor = preprocessor

    def before_train_iter(self,
                          runner,
                          batch_idx: int,
                          data_batch=None) -> None:
        if isinstance(data_batch, MonitoredBatch):
            raise RuntimeError(
                'DataMonitorHook: the training loop got a batch from a '
                'DataLoader iterator that bypasses DataLoader.__iter__; the '
                'monitor cannot unwrap it. Remove DataMonitorHook or iterate '
                'the loader with iter().')
        monitor = self.monitor
        if monitor is None:
            return
        self._iteration = iteration = self._loop.iter
        monitor.step(iteration)
        # The log line's scalars are put here, not in after_train_iter: the
        # interval's sums are the same (a step's compute is known at the
        # next batch only) and the monitor's code and data are warm now
        # (a log line's publishing cost 8 us less with 4 MB swept from the
        # caches before each call). The bounds are checked here: a call
        # fewer on most steps.
        if self._checked_index < batch_idx < self._next_check:
            self._checked_index = batch_idx
        elif self._logger_logs(runner, batch_idx):
            self._publish_interval(runner)
        if monitor.new_points:
            self._add_points(runner, monitor.new_points, POINTS_SECONDS)
        elif (not self._blind_checked and monitor.steps_without_batch > 2
              and monitor.last_step is None):
            self._warn_if_blind(runner)

    def _add_points(self,
                    runner,
                    points,
                    seconds: Optional[float] = None) -> None:
        """Send the timeline points not sent yet (booked on the writer's
        thread), oldest first, to the visualizer, rank 0's, from this
        thread, as LoggerHook sends its scalars: all of them, or those
        sent within ``seconds`` (at least one)."""
        # Asked once, at the first point (training has set up the process
        # group by then): mmengine's get_rank goes through
        # torch.distributed's world state at every call.
        if self._rank is None:
            self._rank = get_rank()
        deadline = None if seconds is None else time.perf_counter() + seconds
        while points:
            point = points.popleft()
            if self._rank == 0:
                runner.visualizer.add_scalars(
                    self._point_scalars(point), step=point['step'] + 1)
                if deadline is not None and time.perf_counter() > deadline:
                    return

    @staticmethod
    def _point_scalars(point: dict) -> dict:
        scalars = {
            'data_monitor/wait_time': point['wait'],
            'data_monitor/compute_time': point['compute'],
            'data_monitor/worker_time': point['worker'],
            'data_monitor/transfer_time': point['transfer']
        }
        scalars.update({
            f'data_monitor/{key}_time': ms
            for key, ms in point['stages'].items()
        })
        return scalars

    def _publish_interval(self, runner) -> None:
        """Put the interval's means into the message hub for LoggerHook,
        which logs them in its ``after_train_iter`` of this step; none when
        no step of the interval was counted (and no worker time without a
        worker's batch)."""
        interval = self.monitor.take_interval()
        steps, wait = interval['steps'], interval['wait']
        span = wait + interval['compute']
        batches = interval['batches']
        values = (None, ) * 3 if not steps else (
            wait / steps, interval['worker'] / batches if batches else None,
            wait / span if span else 0.0)
        scalars = runner.message_hub.log_scalars
        for key, value in zip(LOG_SCALARS, values):
            self._put_log_scalar(scalars, key, value)

    def _put_log_scalar(self, scalars: dict, key: str,
                        value: Optional[float]) -> None:
        """Make ``value`` the only value of ``key`` in the message hub's
        scalars (None: no value).

        The log line shows a mean over the last values of a key: one
        value, the interval's. ``MessageHub.update_scalar`` would append
        to the buffer, so each line had a new buffer, at 50-100 us a line
        on the training thread (two numpy arrays made, the old ones freed,
        all with cold caches); the hook keeps one buffer per key and
        writes its value in place. Put in the scalars directly, the keys
        are not marked resumed: checkpoints do not carry them. Put last
        each time, as a new buffer was: the log line keeps its order.
        """
        scalars.pop(key, None)
        if value is None:
            return
        buffer = self._log_buffers.get(key)
        if buffer is None:
            buffer = self._log_buffers[key] = HistoryBuffer([value], [1])
        else:
            set_only_value(buffer, value)
        scalars[key] = buffer

    @staticmethod
    def _forget_log_scalars(runner) -> None:
        """Forget the dm_* values a message hub holds from before (a
        checkpoint of an older version, which resumed them).

        The log line shows what the message hub holds (the last value, or a
        mean over a window of them): an interval in which no step was
        counted (warm-up after a resume) would repeat them as if measured.
        """
        scalars = runner.message_hub.log_scalars
        for key in LOG_SCALARS:
            scalars.pop(key, None)

    def _logger_logs(self, runner, batch_idx: int) -> bool:
        """Whether LoggerHook writes a log line after this iteration (its
        own condition, see ``LoggerHook.after_train_iter``), for a
        ``batch_idx`` outside the bounds it set last time.

        ``before_train_iter`` calls it only at the next index that may log
        (its interval's end, the epoch's last batch) or when ``batch_idx``
        starts again: most steps cost one comparison there.
        """
        logger = self._logger
        if logger is None:
            self._checked_index, self._next_check = batch_idx, math.inf
            return False
        # len(loader) goes through the batch sampler and the sampler; it
        # changes at most between epochs (batch_idx restarts).
        if self._loader_length is None or batch_idx <= self._checked_index:
            self._loader_length = len(runner.train_dataloader)
        length, interval = self._loader_length, logger.interval
        self._checked_index = batch_idx
        self._next_check = ((batch_idx + 1) // interval + 1) * interval - 1
        if batch_idx < length - 1:
            self._next_check = min(self._next_check, length - 1)
        if logger.every_n_inner_iters(batch_idx, interval):
            return True
        return batch_idx + 1 == length and (not logger.ignore_last
                                            or length <= interval)

    def _warn_if_blind(self, runner) -> None:
        """Warn once that a third step came without a batch, unless a step
        was counted before (then the loop is not blind, and stays so)."""
        self._blind_checked = True
        if self.monitor.counted_steps:
            return
        runner.logger.warning(
            'DataMonitorHook: no batch went through the monitored '
            'DataLoader iterator; this training loop iterates the loader '
            'in a way the monitor cannot see.')

    def after_train_iter(self,
                         runner,
                         batch_idx: int,
                         data_batch=None,
                         outputs=None) -> None:
        if self.monitor is None:
            return
        # (Hook.every_n_train_iters written out: a call fewer per step)
        iteration = self._iteration
        if not self.table_interval or (iteration + 1) % self.table_interval:
            return
        if self._spaced < self._submitted:
            # Every rank must make the same choice (a refresh gathers all
            # ranks): wait for the writer to decide, which takes
            # milliseconds, while table_interval iterations have passed.
            self._writer.flush()
        if iteration + 1 < self._next_table:
            return
        self._submitted += 1
        self._writer.submit(self._refresh, runner,
                            self._snapshot(runner, with_window=True))
        # Copying the figures is not the model's compute time.
        self.monitor.mark_pause(settle=False)

    def _refresh(self, runner, snapshot: dict) -> None:
        """Log the window's tables and rewrite the JSON file (on the
        writer's thread)."""
        report, windows = self._gather_report(snapshot)
        if get_rank() != 0:
            return
        worst = report['verdict'].get('worst_rank', 0)
        tables = [
            format_worker_table(
                windows[worst],
                f"DataMonitor at iteration {snapshot['iteration'] + 1}, rank "
                f'{worst}, last {windows[worst]["steps"]} counted '
                'steps (ms per batch):')
        ]
        if len(windows) > 1:
            tables.append(format_rank_table(report))
        runner.logger.info('\n' + '\n'.join(tables) + '\n' +
                           report['verdict']['summary'])
        save_report(report, self._path(runner, 'json'), self._encoded)

    # ------------------------------------------------------------ pauses
    def before_val(self, runner) -> None:
        if self.monitor is not None:
            self.monitor.mark_pause()

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        if self.monitor is not None:
            self.monitor.mark_pause()

    # ------------------------------------------------------------ end
    def after_train(self, runner) -> None:
        if self.monitor is None:
            return
        self._writer.close()
        self.monitor.book_on(None)
        report, _ = self._gather_report(self._snapshot(runner))
        # The points of the last steps, booked just now, and those the
        # steps' time for points left unsent.
        self._add_points(runner, self.monitor.new_points)
        if self._group is not None:
            torch_dist.destroy_process_group(self._group)
            self._group = None
        self.monitor.uninstall()
        if self._preprocessor is not None:
            del self._preprocessor.forward
            self._preprocessor = None
        if get_rank() != 0:
            return
        json_path = self._path(runner, 'json')
        save_report(report, json_path, self._encoded)
        outputs = json_path
        if self.plot:
            outputs += ', ' + plot_report(report, self._path(runner, 'png'))
        runner.logger.info('\n' + format_report(report) +
                           f'\nDataMonitor report written to {outputs}')

    def _snapshot(self, runner, with_window: bool = False) -> dict:
        """What a report is made of, copied on the training thread; the
        figures are computed by :meth:`_gather_report`, on any thread."""
        return dict(
            summaries=self.monitor.deferred_summaries(window=with_window),
            refresh=with_window,
            iteration=runner.iter,
            elapsed=time.monotonic() - self._started,
            max_iters=runner.max_iters,
            **self._run_context)

    def _gather_report(self, snapshot: dict):
        """The report of all ranks, and their window summaries (or None).

        A collective: every rank calls it for the same iteration.
        """
        rank = get_rank()
        mine = dict(elapsed=snapshot['elapsed'])
        try:
            total, window = snapshot['summaries']()
            mine['total'] = dict(total, rank=rank)
            if window is not None:
                mine['window'] = dict(window, rank=rank)
        except Exception as error:
            # Still gathered, and the refreshes still spaced: a rank that
            # left the collective alone would pair its next gather with
            # its peers' last one.
            mine = dict(elapsed=snapshot['elapsed'], error=repr(error))
        gathered = all_gather_object(mine, group=self._group)
        if snapshot['refresh']:
            self._space_refreshes(snapshot['iteration'],
                                  gathered[0]['elapsed'])
        failed = [(r, g['error']) for r, g in enumerate(gathered)
                  if 'error' in g]
        if failed:
            raise RuntimeError('the figures of rank(s) ' + ', '.join(
                f'{r} ({error})' for r, error in failed) + ' failed')
        report = build_report([g['total'] for g in gathered],
                              world_size=get_world_size(),
                              iteration=snapshot['iteration'],
                              max_iters=snapshot['max_iters'])
        add_head_cache(report, self._read_head_cache(snapshot),
                       snapshot['pipeline'])
        add_remote_cache(report, snapshot['dataset'],
                         snapshot['iteration'] * self._node_ranks)
        return report, [g.get('window') for g in gathered]

    def _space_refreshes(self, iteration: int, elapsed: float) -> None:
        """Set the iteration of the next refresh: ``table_interval``
        iterations on, or as many whole intervals as the time since the
        last refresh says make ``table_min_seconds``. ``elapsed`` is rank
        0's (gathered): every rank decides alike."""
        last_elapsed, last_iteration = self._last_table
        self._last_table = (elapsed, iteration)
        intervals = 1
        seconds = elapsed - last_elapsed
        if self.table_min_seconds and seconds > 0:
            per_interval = (seconds / (iteration - last_iteration) *
                            self.table_interval)
            intervals = max(1,
                            math.ceil(self.table_min_seconds / per_interval))
        self._next_table = iteration + 1 + intervals * self.table_interval
        self._spaced += 1

    def _read_head_cache(self, snapshot: dict) -> Optional[dict]:
        """The head cache's figures: read afresh for the final report, at
        most every ``HEAD_CACHE_READ_EVERY`` seconds for a refresh's."""
        now = time.monotonic()
        final = not snapshot['refresh']
        if (final or self._head_cache is None
                or now - self._head_cache[0] >= HEAD_CACHE_READ_EVERY):
            self._head_cache = (now, read_head_cache(snapshot['dataset']))
        summary = self._head_cache[1]
        return None if summary is None else dict(summary)

    def _path(self, runner, extension: str) -> str:
        return osp.join(self.out_dir or runner.log_dir,
                        f'data_monitor.{extension}')


def apply_data_monitor_env(cfg: Config, environ=None) -> Optional[bool]:
    """Turn ``DataMonitorHook`` on or off by ``MMDATA_MONITOR``.

    ``MMDATA_MONITOR=1`` adds ``dict(type='DataMonitorHook')`` to
    ``cfg.custom_hooks`` unless the config already has one;
    ``MMDATA_MONITOR=0`` removes it. Unset or empty: the config decides.

    Args:
        cfg (Config): The training config, changed in place.
        environ (Mapping, optional): Defaults to ``os.environ``.

    Returns:
        bool | None: Whether the hook is requested; None when unset.
    """
    value = (os.environ if environ is None else environ).get(MONITOR_ENV, '')
    value = value.strip().lower()
    if not value:
        return None
    if value not in ('1', 'true', 'on', 'yes', '0', 'false', 'off', 'no'):
        raise ValueError(f'{MONITOR_ENV}={value!r}: expected 1 (on) or 0 '
                         '(off)')
    enabled = value in ('1', 'true', 'on', 'yes')
    hooks = list(cfg.get('custom_hooks', None) or [])
    present = [
        h for h in hooks
        if h.get('type') in ('DataMonitorHook', DataMonitorHook)
    ]
    if enabled and not present:
        hooks.append(dict(type='DataMonitorHook'))
    elif not enabled:
        hooks = [h for h in hooks if not any(h is p for p in present)]
    cfg.custom_hooks = hooks
    print_log(
        f'{MONITOR_ENV}={value}: DataMonitorHook '
        f'{"on" if enabled else "off"}.',
        logger='current',
        level=logging.INFO)
    return enabled
