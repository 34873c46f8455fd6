"""RayDataNodesHook: the train DataLoader's batches made by Ray actors."""
from typing import Optional

import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS
from torch.utils.data import DataLoader

from ...data_nodes import ActorPool, RayBatchStream, connect, import_ray
from ...utils.dataloader_slots import (dataloader_class_with_iter,
                                       rebind_dataloader_attribute)
from ...utils.started_iterators import restart_started_iterator

def _ray_iterator(loader: DataLoader, base: type) -> RayBatchStream:
    # A local iterator draws its workers' base seed from the loader's
    # generator here; drawing it too keeps the training process's random
    # stream (dropout, batch augmentations) that of a run with local
    # workers.
    torch.empty((), dtype=torch.int64).random_(generator=loader.generator)
    nodes = loader._ray_data_nodes
    return RayBatchStream(
        iter(loader.batch_sampler), nodes.pool, nodes.max_inflight,
        loader.pin_memory and torch.cuda.is_available())


def _ray_loader_class(base: type) -> type:
    """``base`` whose ``__iter__`` returns a :class:`RayBatchStream`."""
    return dataloader_class_with_iter(base, 'Ray', _ray_iterator)


class _Nodes:
    """What the Ray loader class needs: the pool and the window size."""

    def __init__(self, pool: ActorPool, max_inflight: int) -> None:
        self.pool = pool
        self.max_inflight = max_inflight


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
    replaced and its unfinished batches are produced again, in order. The
    DataLoader's own workers are not started.

    Config::

        custom_hooks = [dict(type='RayDataNodesHook', num_actors=4,
                             address='auto')]

    Args:
        num_actors (int): Data actors per training process. Defaults to 2.
        address (str, optional): The Ray cluster: ``'host:6379'``,
            ``'ray://host:10001'``, ``'auto'`` (the cluster this node has
            joined) or None (an already connected Ray, else a new local
            one). Defaults to None.
        resources (dict, optional): Custom Ray resources each actor needs,
            e.g. ``{'data_node': 1}`` to keep actors on data nodes.
            Defaults to None.
        num_cpus (float): CPUs each actor reserves. Defaults to 1.
        max_inflight (int, optional): Batches in production at once.
            Defaults to ``2 * num_actors``.
    """

    # Before DataMonitorHook and DeviceFeedHook: they wrap what it makes.
    priority = 'ABOVE_NORMAL'

    def __init__(self,
                 num_actors: int = 2,
                 address: Optional[str] = None,
                 resources: Optional[dict] = None,
                 num_cpus: float = 1,
                 max_inflight: Optional[int] = None) -> None:
        if num_actors < 1:
            raise ValueError(
                f'RayDataNodesHook: num_actors={num_actors} must be >= 1')
        if max_inflight is not None and max_inflight < 1:
            raise ValueError(
                f'RayDataNodesHook: max_inflight={max_inflight} must be '
                '>= 1')
        self.num_actors = num_actors
        self.address = address
        self.resources = dict(resources or {})
        self.num_cpus = num_cpus
        self.max_inflight = max_inflight or 2 * num_actors
        # The actors of the current (or last) run.
        self.pool: Optional[ActorPool] = None
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
        self._connected = connect(self.address)
        try:
            self.pool = pool = ActorPool(
                loader.dataset, loader.collate_fn, self.num_actors,
                dict(num_cpus=self.num_cpus, resources=self.resources),
                seed=runner.seed)
        except BaseException:
            self._disconnect()
            raise
        self._install(loader, _Nodes(pool, self.max_inflight), loop)
        where = ', '.join(f'{n.host} ({n.node_ip})' for n in pool.nodes)
        runner.logger.info(
            f'RayDataNodesHook: {self.num_actors} data actors on {where} '
            f'make the training batches, {self.max_inflight} in flight.')

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

    def after_train(self, runner) -> None:
        if self._loader is None:
            return
        self.pool.close()
        if type(self._loader) is _ray_loader_class(self._base_class):
            rebind_dataloader_attribute(self._loader, '__class__',
                                        self._base_class)
        del self._loader._ray_data_nodes
        self._loader = None
        self._disconnect()

    def _disconnect(self) -> None:
        if self._connected:
            import_ray().shutdown()
            self._connected = False
