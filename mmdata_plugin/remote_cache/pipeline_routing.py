"""Which transforms of a pipeline read through the node cache, and how to
route them there."""
from typing import List, Optional, Sequence, Union


def _reading_transforms(dataset) -> List:
    """Transforms of ``dataset``'s pipeline (nested wrappers included)
    that read files through fileio (they have ``backend_args``)."""
    found, pending = [], [getattr(dataset, 'pipeline', None)]
    while pending:
        item = pending.pop()
        if item is None:
            continue
        if hasattr(item, 'backend_args'):
            found.append(item)
        children = getattr(item, 'transforms', None)
        if isinstance(children, (list, tuple)):
            pending.extend(reversed(children))
    return found


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


class SampleFiles:
    """``sample id -> files it reads``, from the dataset's data infos.

    Args:
        dataset: A dataset with ``get_data_info``.
        path_keys (Sequence[str]): Data-info keys that hold file paths.
    """

    def __init__(self, dataset, path_keys: Sequence[str]) -> None:
        self.dataset = dataset
        self.path_keys = tuple(path_keys)

    def check_keys(self, where: str, probes: int = 16) -> None:
        """Raise when none of the first ``probes`` samples has a file
        under the path keys (keys that do not match the dataset would
        leave nothing to prefetch), naming the keys the samples have."""
        count = min(probes, len(self.dataset))
        if count == 0 or any(self(sample) for sample in range(count)):
            return
        keys = sorted(self.dataset.get_data_info(0))
        raise ValueError(
            f'{where}={list(self.path_keys)}: none of the first {count} '
            f'samples has a file path (a str) under these keys; sample 0 '
            f'has the keys {keys}. Name the keys that hold the paths of '
            'the files a sample reads.')

    def __call__(self, sample: int) -> List[str]:
        info = self.dataset.get_data_info(sample)
        return [
            info[key] for key in self.path_keys
            if isinstance(info.get(key), str)
        ]
