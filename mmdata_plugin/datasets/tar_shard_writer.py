"""Pack a ``relative/path label`` list into WebDataset tar shards."""
import io
import os
import os.path as osp
import tarfile
from typing import List

from .annotation_lines import iter_path_labels


def pack_image_list(ann_file: str,
                    data_root: str,
                    out_dir: str,
                    prefix: str,
                    samples_per_shard: int = 1000) -> List[str]:
    """Write the listed images as ``<key>.<ext>`` + ``<key>.cls`` members.

    Keys are the samples' positions in the list (zero-padded); shards are
    ``out_dir/<prefix>-000000.tar`` ... , each written to a temporary name
    and renamed, so a reader never sees half a shard.

    Returns:
        list[str]: The shards' paths.
    """
    os.makedirs(out_dir, exist_ok=True)
    samples = [(path, label)
               for _, path, label in iter_path_labels(ann_file)]
    shards = []
    for first in range(0, len(samples), samples_per_shard):
        shard = osp.join(out_dir,
                         f'{prefix}-{first // samples_per_shard:06d}.tar')
        tmp = f'{shard}.tmp.{os.getpid()}'
        with tarfile.open(tmp, 'w', format=tarfile.PAX_FORMAT) as tar:
            for number in range(first,
                                min(first + samples_per_shard,
                                    len(samples))):
                path, label = samples[number]
                ext = osp.splitext(path)[1].lstrip('.').lower()
                key = f'{number:08d}'
                tar.add(osp.join(data_root, path), arcname=f'{key}.{ext}')
                _add_bytes(tar, f'{key}.cls', str(label).encode())
        os.replace(tmp, shard)
        shards.append(shard)
    return shards


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))
