"""RayDataNodesHook: the train DataLoader's batches made by Ray actors."""
import weakref
from typing import List, Optional, Union

import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS
from torch.utils.data import DataLoader

from ...data_monitor.verdict import (MODERATE, actors_needed,
                                     workers_needed)
from ...data_monitor.worker_timing import MonitoredBatch
from ...data_nodes import (ActorPool, LocalShare, RayBatchStream, connect,
                           import_ray)
from ...utils.dataloader_slots import (dataloader_class_with_iter,
                                       rebind_dataloader_attribute)
from ...utils.started_iterators import restart_started_iterator
from .data_monitor_hook import DataMonitorHook


def _ray_iterator(loader: DataLoader, base: type) -> RayBatchStream:
    nodes = loader._ray_data_nodes
    if nodes.local is None and not (loader.persistent_workers
                                    and nodes.seed_drawn):
        # A local iterator draws its workers' base seed from the loader's
        # generator when it starts: every pass, or only the first with
        # persistent workers. Drawing it likewise keeps the training
        # process's random stream (dropout, batch augmentations) that of a
        # run with local workers. A local share's iterator draws it itself.
        torch.empty((), dtype=torch.int64).random_(generator=loader.generator)
        nodes.seed_drawn = True
    # Under the data monitor each batch travels with its actor's record,
    # as a local worker's does.
    monitored = getattr(loader, '_data_monitor', None) is not None
    return RayBatchStream(
        iter(loader.batch_sampler), nodes.pool, nodes.max_inflight,
        loader.pin_memory and torch.cuda.is_available(),
        wrap=MonitoredBatch if monitored else None,
        local=nodes.local,
        made=nodes.made)


#: Hooks between before_train and after_run. mmengine calls no hook when
#: training raises: a run that raised leaves its actors holding the data
#: nodes' CPUs (and this process connected) while it is referenced (a
#: notebook's last traceback); the next run in this process closes them.
_OPEN_RUNS: 'weakref.WeakSet[RayDataNodesHook]' = weakref.WeakSet()


def _ray_loader_class(base: type) -> type:
    """``base`` whose ``__iter__`` returns a :class:`RayBatchStream`."""
    return dataloader_class_with_iter(base, 'Ray', _ray_iterator)


class _Nodes:
    """What the Ray loader class needs (the pool and the window size) and
    what the data monitor reports of it (:meth:`context`)."""

    def __init__(self, pool: ActorPool, max_inflight: Optional[int],
                 local: Optional[LocalShare], settings: dict) -> None:
        self.pool = pool
        self.max_inflight = max_inflight
        self.local = local
        self.settings = settings
        self.resizes: List[dict] = []
        # Batches handed out, by who made them.
        self.made = dict(local=0, actors=0)
        # Whether a pass drew the workers' base seed (see _ray_iterator).
        self.seed_drawn = False

    def context(self) -> dict:
        return dict(
            self.settings,
            actors=self.pool.size,
            local_workers=0 if self.local is None else self.local.num_workers,
            batches_made=dict(self.made),
            resizes=list(self.resizes))


class _AutoSize:
    """``num_actors='auto'``: from the steps the data monitor counted since
    the last decision (at least ``every``), the actors that keep up with
    the training step (:func:`~mmdata_plugin.data_monitor.verdict.
    workers_needed` of the actors' mean production time per batch and the
    mean step), within ``[low, high]``.

    With ``local_workers`` (producers of the same batches, their records
    among the actors'), the actors needed are those producers less the
    local workers, at least one.

    The pool grows to them while the trainer waits (a moderate waiting
    share, the verdict's 5%), and shrinks, keeping one actor to spare,
    while it does not: a new actor costs seconds to start, and a
    measurement on a loaded machine jitters by one.
    """

    def __init__(self, monitor, low: int, high: int, every: int,
                 local_workers: int = 0) -> None:
        self.monitor = monitor
        self.low, self.high, self.every = low, high, every
        self.local_workers = local_workers
        # Its sums must follow the steps within a sizing period.
        monitor.book_within(every)
        self.restart()

    def restart(self) -> None:
        """Measure from now on (the pool has just changed)."""
        self._mark = self.monitor.booked_totals

    def wanted(self, actors: int) -> Optional[tuple]:
        """``(actors wanted, production ms, step ms, waiting share)`` when
        the pool of ``actors`` should change; None otherwise (or before
        ``every`` more steps were booked: DataMonitorHook books them in
        runs, on its writer's thread)."""
        now, mark = self.monitor.booked_totals, self._mark
        steps = now[0] - mark[0]
        if steps < self.every:
            return None
        self._mark = now
        waited, production, batches, compute, computes = (
            a - b for a, b in zip(now[1:], mark[1:]))
        if not batches or not computes:
            return None
        production, step = 1e3 * production / batches, 1e3 * compute / computes
        needed = actors_needed(workers_needed(production, step),
                               self.local_workers)
        if needed is None:
            return None
        share = 1e3 * waited / (1e3 * waited + step * steps)
        if share >= MODERATE and needed > actors:
            wanted = min(needed, self.high)
        elif share < MODERATE and needed + 1 < actors:
            wanted = max(needed + 1, self.low)
        else:
            return None
        if wanted == actors:
            return None
        return wanted, production, step, share


@HOOKS.register_module()
class RayDataNodesHook(Hook):
    """Produce the training batches on Ray actors, on any node of a Ray
    cluster (CPU-only data nodes included).

    The training process keeps iterating the train DataLoader's batch
    sampler (indices only: its exact order, fast-resume positioning
    included) and sends each batch of indices to a data actor, round-robin,
    with up to ``max_inflight`` batches in production. Each actor holds the
    DataLoader's dataset and ``collate_fn`` (shipped once through Ray's
    object store), runs ``dataset[i]`` for each index and the collate as a
    DataLoader worker would, and returns the batch as one block
    (:func:`~mmdata_plugin.handover.pack_batch`). Batches are handed out in
    the sampler's order, as local workers give them (``DeviceFeedHook``
    takes the blocks of ``block_collate`` as they are). With the
    fast-resume loops (per-sample seeds) the stream is bitwise the one of
    local workers, whatever the number of actors. A dead actor is
    replaced and its unfinished batches are produced again, in order.

    The DataLoader's own workers are not started, unless ``local_workers``:
    then they make a share of the batches (with the DataLoader's
    ``num_workers``, ``collate_fn``, ``worker_init_fn``, ``prefetch_factor``,
    ``persistent_workers`` and ``pin_memory``) and the actors the rest, all
    handed out in the sampler's order; who makes a batch does not change
    it. Each side draws the next batch of indices when it has room: the
    local workers keep ``prefetch_factor * num_workers`` batches in
    production and the actors ``max_inflight``, so in the steady state the
    local share is ``prefetch_factor * num_workers / (prefetch_factor *
    num_workers + max_inflight)`` (with the defaults: in proportion to the
    local workers and the actors). Raise ``max_inflight`` to give the
    actors more.

    With ``num_actors='auto'`` the pool starts with ``min_actors`` and is
    resized while training, within ``[min_actors, max_actors]``, to the
    actors that keep up with the training step, from what
    ``DataMonitorHook`` measures (needed: it times each actor's batches and
    the step) every ``resize_every`` counted steps. New actors take
    batches once started; removed ones finish theirs. The stream does not
    change: the trainer's batch sampler decides the order.

    Config::

        custom_hooks = [dict(type='RayDataNodesHook', num_actors=4,
                             address='auto')]
        # or sized from the measurements:
        custom_hooks = [dict(type='DataMonitorHook'),
                        dict(type='RayDataNodesHook', num_actors='auto',
                             min_actors=1, max_actors=8, address='auto')]

    Args:
        num_actors (int | str): Data actors per training process, or
            ``'auto'``. Defaults to 2.
        address (str, optional): The Ray cluster: ``'host:6379'``,
            ``'ray://host:10001'``, ``'auto'`` (the cluster this node has
            joined) or None (an already connected Ray, else a new local
            one). Defaults to None.
        resources (dict, optional): Custom Ray resources each actor needs,
            e.g. ``{'data_node': 1}`` to keep actors on data nodes.
            Defaults to None.
        num_cpus (float): CPUs each actor reserves. Defaults to 1.
        max_inflight (int, optional): Batches in production at once.
            Defaults to twice the actors taking batches.
        min_actors (int): With ``'auto'``: the actors to start with and the
            fewest kept. Defaults to 1.
        max_actors (int, optional): With ``'auto'``: the most actors (needed
            there). Defaults to None.
        resize_every (int): With ``'auto'``: counted steps of the monitor
            between two sizing decisions. Defaults to 20.
        local_workers (bool): Keep the train DataLoader's own workers
            making a share of the batches (mixed local and remote
            production); needs ``num_workers >= 1``. Defaults to False.
    """

    # Before DataMonitorHook and DeviceFeedHook: they wrap what it makes.
    priority = 'ABOVE_NORMAL'

    def __init__(self,
                 num_actors: Union[int, str] = 2,
                 address: Optional[str] = None,
                 resources: Optional[dict] = None,
                 num_cpus: float = 1,
                 max_inflight: Optional[int] = None,
                 min_actors: int = 1,
                 max_actors: Optional[int] = None,
                 resize_every: int = 20,
                 local_workers: bool = False) -> None:
        self.auto = num_actors == 'auto'
        if self.auto:
            if max_actors is None or not 1 <= min_actors <= max_actors:
                raise ValueError(
                    "RayDataNodesHook: num_actors='auto' needs 1 <= "
                    f'min_actors <= max_actors, got min_actors={min_actors}'
                    f', max_actors={max_actors}')
            if resize_every < 1:
                raise ValueError(f'RayDataNodesHook: resize_every='
                                 f'{resize_every} must be >= 1')
        elif not isinstance(num_actors, int) or num_actors < 1:
            raise ValueError(
                f'RayDataNodesHook: num_actors={num_actors!r} must be an '
                "int >= 1 or 'auto'")
        if max_inflight is not None and max_inflight < 1:
            raise ValueError(
                f'RayDataNodesHook: max_inflight={max_inflight} must be '
                '>= 1')
        self.num_actors = num_actors
        self.address = address
        self.resources = dict(resources or {})
        self.num_cpus = num_cpus
        self.max_inflight = max_inflight
        self.min_actors = min_actors
        self.max_actors = max_actors
        self.resize_every = resize_every
        self.local_workers = local_workers
        # The actors of the current (or last) run.
        self.pool: Optional[ActorPool] = None
        self._nodes: Optional[_Nodes] = None
        self._sizing: Optional[_AutoSize] = None
        self._loader: Optional[DataLoader] = None
        self._base_class: Optional[type] = None
        self._connected = False

    def before_train(self, runner) -> None:
        loop = runner.train_loop
        loader = getattr(loop, 'dataloader', None)
        if not isinstance(loader, DataLoader) or (
                loader.batch_sampler is None):
            raise TypeError(
                'RayDataNodesHook needs a map-style torch DataLoader with '
                'a batch sampler as train_loop.dataloader, got '
                f'{type(loader).__name__}')
        # Checked before any actor starts.
        local = LocalShare(loader) if self.local_workers else None
        if self.auto and not self._monitor_hooks(runner):
            raise ValueError(
                "RayDataNodesHook: num_actors='auto' sizes the pool from "
                "what DataMonitorHook measures: add dict(type='"
                "DataMonitorHook') to custom_hooks, or give num_actors as "
                'an int')
        self._close_runs_that_raised(runner)
        self._connected = connect(self.address)
        start = self.min_actors if self.auto else self.num_actors
        try:
            self.pool = pool = ActorPool(
                loader.dataset, loader.collate_fn, start,
                dict(num_cpus=self.num_cpus, resources=self.resources),
                seed=runner.seed)
        except BaseException:
            self._disconnect()
            raise
        self._nodes = _Nodes(
            pool, self.max_inflight, local,
            dict(num_actors=self.num_actors,
                 min_actors=self.min_actors if self.auto else None,
                 max_actors=self.max_actors if self.auto else None,
                 max_inflight=self.max_inflight))
        self._install(loader, self._nodes, loop)
        _OPEN_RUNS.add(self)
        where = ', '.join(f'{n.host} ({n.node_ip})' for n in pool.nodes)
        inflight = self.max_inflight or 'twice as many batches'
        sizing = (f', sized from the measurements within {self.min_actors}'
                  f'-{self.max_actors}' if self.auto else '')
        share = (f'; {loader.num_workers} local DataLoader workers make '
                 f'a share, {local.depth} in flight' if local else '')
        runner.logger.info(
            f'RayDataNodesHook: {start} data actors on {where} make the '
            f'training batches, {inflight} in flight{share}{sizing}.')

    @staticmethod
    def _monitor_hooks(runner) -> list:
        return [h for h in runner.hooks if isinstance(h, DataMonitorHook)]

    def _install(self, loader: DataLoader, nodes: _Nodes, loop) -> None:
        self._loader = loader
        self._base_class = type(loader)
        loader._ray_data_nodes = nodes
        rebind_dataloader_attribute(loader, '__class__',
                                    _ray_loader_class(self._base_class))
        # An iterator the loop started before this hook (stock
        # IterBasedTrainLoop starts one in __init__) has produced nothing
        # yet: its workers stop and a Ray stream starts the same pass.
        restart_started_iterator(loader, loop)

    def after_train_iter(self,
                         runner,
                         batch_idx: int,
                         data_batch=None,
                         outputs=None) -> None:
        if not self.auto or self.pool is None:
            return
        if self._sizing is None:
            monitor = self._monitor_hooks(runner)[0].monitor
            if monitor is None:  # it measures nothing: nothing to size by
                return
            self._sizing = _AutoSize(
                monitor, self.min_actors, self.max_actors, self.resize_every,
                self._nodes.context()['local_workers'])
        if self.pool.size < self.pool.target:
            # New actors are starting: measure the pool once they work.
            self._sizing.restart()
            return
        wanted = self._sizing.wanted(self.pool.size)
        if wanted is None:
            return
        actors, production, step, share = wanted
        runner.logger.info(
            f'RayDataNodesHook: {self.pool.size} -> {actors} data actors '
            f'(a batch takes {production:.1f} ms of an actor, a training '
            f'step {step:.1f} ms, {100 * share:.0f}% of the time waiting '
            f'for data; within {self.min_actors}-{self.max_actors}).')
        self.pool.resize(actors)
        self._nodes.resizes.append(dict(iteration=runner.iter + 1,
                                        actors=actors))

    def _close_runs_that_raised(self, runner) -> None:
        for left in list(_OPEN_RUNS):
            if left is not self:
                runner.logger.warning(
                    f'RayDataNodesHook: closing the {left.pool.size} data '
                    'actor(s) a run in this process left when its training '
                    'raised.')
                left.after_run(runner)

    def after_run(self, runner) -> None:
        # Not after_train: the data monitor's final report (its after_train
        # runs after this hook's) describes the actors.
        if self._loader is None:
            return
        _OPEN_RUNS.discard(self)
        self.pool.close()
        if self._nodes.local is not None:
            self._nodes.local.close()
        if type(self._loader) is _ray_loader_class(self._base_class):
            rebind_dataloader_attribute(self._loader, '__class__',
                                        self._base_class)
        del self._loader._ray_data_nodes
        self._loader = None
        self._sizing = None
        self._disconnect()

    def _disconnect(self) -> None:
        if self._connected:
            import_ray().shutdown()
            self._connected = False
