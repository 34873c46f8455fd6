"""Load ``.npy`` / raw arrays as tensors, without deserialising them."""
import contextlib
from typing import Optional, Sequence

import mmengine.fileio as fileio
from mmcv.transforms import BaseTransform
from mmengine.fileio.backends import LocalBackend
from mmengine.registry import TRANSFORMS
from torch.utils.data import get_worker_info

from .array_files import read_array


@TRANSFORMS.register_module()
class LoadNumpyFromFile(BaseTransform):
    """Load an ``.npy`` or raw array file into a tensor at disk speed.

    In a DataLoader worker the kernel copies the array's bytes into a new
    shared-memory segment that becomes the tensor's storage (``sendfile``
    into a memfd; elsewhere one ``readinto`` into a tensor allocated in
    shared memory), so it reaches the training process as a shared-memory
    handle: no pickling, no ``np.load`` deserialisation, no copy by Python. ``.npy`` files are read by their
    header (dtype, shape, Fortran order, byte order); other files as raw
    bytes of the configured ``dtype`` and ``shape``. Object arrays (which
    need pickle) are refused, as are truncated files and files whose header
    contradicts the config, with an error naming the file.

    Files are read where they lie; a path another fileio backend serves
    (``s3://``, ``http://``, a cache backend) is read from the local copy
    its ``get_local_path`` gives.

    Keep mmengine's default ``pseudo_collate`` (it keeps the per-sample
    tensors, handing each over as shared memory); a stacking collate makes
    one more copy into the batch.

    Required keys: ``path_key`` (``img_path``).

    Added keys: ``key`` (a tensor), and with ``key='img'`` also
    ``img_shape`` and ``ori_shape`` (the first two dimensions), so that
    :class:`PackImageLabelInputs` and mmcv's image conventions apply to HWC
    arrays.

    Args:
        key (str): Where to put the tensor. Defaults to 'img'.
        path_key (str): Where the file path is. Defaults to 'img_path'.
        dtype (str, optional): numpy dtype: required for raw files; for
            ``.npy`` files the header must agree.
        shape (Sequence[int], optional): Array shape: raw files (one -1 is
            inferred; None: 1-D); for ``.npy`` files the header must agree
            (-1 matches any size).
        backend_args (dict, optional): mmengine fileio arguments for paths
            that are not local files.
    """

    def __init__(self,
                 key: str = 'img',
                 path_key: str = 'img_path',
                 dtype: Optional[str] = None,
                 shape: Optional[Sequence[int]] = None,
                 backend_args: Optional[dict] = None) -> None:
        self.key = key
        self.path_key = path_key
        self.dtype = dtype
        self.shape = None if shape is None else tuple(shape)
        self.backend_args = backend_args.copy() if backend_args else None

    def transform(self, results: dict) -> dict:
        path = results[self.path_key]
        with self._local_path(path) as local:
            name = path if local == path else f'{path} (local copy {local})'
            if 'sample_idx' in results:
                name += f' of sample {results["sample_idx"]}'
            array = read_array(
                local,
                self.dtype,
                self.shape,
                # Only a worker's tensors travel to another process.
                shared=get_worker_info() is not None,
                name=name)
        results[self.key] = array
        if self.key == 'img':
            results['img_shape'] = results['ori_shape'] = tuple(
                array.shape[:2])
        return results

    def _local_path(self, path: str):
        backend = fileio.get_file_backend(
            path, backend_args=self.backend_args)
        if isinstance(backend, LocalBackend):
            return contextlib.nullcontext(path)
        if not hasattr(backend, 'get_local_path'):
            raise TypeError(
                f'LoadNumpyFromFile reads files in place, but {path} is '
                f'served by {type(backend).__name__}, which has no '
                'get_local_path (a local copy to read)')
        return backend.get_local_path(path)

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(key={self.key!r}, '
                f'path_key={self.path_key!r}, dtype={self.dtype!r}, '
                f'shape={self.shape!r}, backend_args={self.backend_args!r})')
