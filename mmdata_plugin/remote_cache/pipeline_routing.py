"""Which transforms of a pipeline read through the node cache, how to
route them there, and which files a sample reads."""
from typing import Callable, Iterator, List, Optional, Sequence, Union

#: The data-info key whose file a pipeline head's entry stands in for.
HEAD_SOURCE_KEY = 'img_path'


def pipeline_transforms(dataset) -> Iterator:
    """Transforms of ``dataset``'s pipeline in order, those nested in
    wrappers (``transforms`` lists) included."""
    pending = [getattr(dataset, 'pipeline', None)]
    while pending:
        item = pending.pop()
        if item is None:
            continue
        yield item
        children = getattr(item, 'transforms', None)
        if isinstance(children, (list, tuple)):
            pending.extend(reversed(children))


def _reading_transforms(dataset) -> List:
    """Transforms of ``dataset``'s pipeline that read files through fileio
    (they have ``backend_args``)."""
    return [
        item for item in pipeline_transforms(dataset)
        if hasattr(item, 'backend_args')
    ]


def find_node_cache_args(dataset) -> Optional[dict]:
    """The ``backend_args`` of the first transform of ``dataset``'s
    pipeline that reads through the ``node_cache`` backend."""
    for transform in _reading_transforms(dataset):
        args = transform.backend_args
        if isinstance(args, dict) and args.get('backend') == 'node_cache':
            return args
    return None


def route_through_node_cache(dataset, cache_dir: str,
                             cache_limit: Union[int, str],
                             remote: Optional[dict] = None) -> int:
    """Make every reading transform of the pipeline read through the node
    cache; what it read with before becomes the cache's ``remote``.

    Must run before the DataLoader workers start (they get a copy).

    Returns:
        int: Transforms routed.
    """
    routed = 0
    for transform in _reading_transforms(dataset):
        before = transform.backend_args
        if isinstance(before, dict) and before.get('backend') == 'node_cache':
            continue
        transform.backend_args = dict(
            backend='node_cache',
            cache_dir=cache_dir,
            cache_limit=cache_limit,
            remote=remote if remote is not None else before)
        routed += 1
    return routed


def _served_by_none(path: str) -> bool:
    return False


class SampleFiles:
    """``sample id -> files it reads``, from the dataset's data infos.

    Args:
        dataset: A dataset with ``get_data_info``.
        path_keys (Sequence[str]): Data-info keys that hold file paths.
        head_serves (callable, optional): ``head_serves(path) -> bool``:
            whether a pipeline head in front of the loading transforms
            serves the file under ``HEAD_SOURCE_KEY`` from its own entry
            (:meth:`~mmdata_plugin.cache.head_sources.HeadSources.serves`);
            such a file is not read, so not listed. Default: none is.
    """

    def __init__(self,
                 dataset,
                 path_keys: Sequence[str],
                 head_serves: Optional[Callable[[str], bool]] = None) -> None:
        self.dataset = dataset
        self.path_keys = tuple(path_keys)
        self.head_serves = head_serves or _served_by_none

    def check_keys(self, where: str, probes: int = 16) -> None:
        """Raise when none of the first ``probes`` samples has a file
        under the path keys (keys that do not match the dataset would
        leave nothing to prefetch), naming the keys the samples have."""
        count = min(probes, len(self.dataset))
        if count == 0 or any(
                self.files(sample) for sample in range(count)):
            return
        keys = sorted(self.dataset.get_data_info(0))
        raise ValueError(
            f'{where}={list(self.path_keys)}: none of the first {count} '
            f'samples has a file path (a str) under these keys; sample 0 '
            f'has the keys {keys}. Name the keys that hold the paths of '
            'the files a sample reads.')

    def files(self, sample: int) -> List[str]:
        """The files under the path keys, served by a head or not."""
        return [path for _, path in self._paths(sample)]

    def __call__(self, sample: int) -> List[str]:
        """The files a read of ``sample`` reads."""
        return [
            path for key, path in self._paths(sample)
            if key != HEAD_SOURCE_KEY or not self.head_serves(path)
        ]

    def nbytes(self, sample: int) -> Optional[int]:
        """Bytes of the files under the path keys (a head's or not) as the
        dataset tells them without reading one, from its
        ``sample_nbytes(idx, key)`` (e.g. :class:`~mmdata_plugin.datasets.
        TarShardDataset`'s shard index); None when it cannot tell."""
        told = getattr(self.dataset, 'sample_nbytes', None)
        if told is None:
            return None
        total = 0
        for key in self.path_keys:
            size = told(sample, key)
            if size is None:
                return None
            total += size
        return total

    def _paths(self, sample: int) -> List[tuple]:
        info = self.dataset.get_data_info(sample)
        return [(key, info[key]) for key in self.path_keys
                if isinstance(info.get(key), str)]
