"""The samples of one WebDataset tar shard, read from its headers.

WebDataset's convention: a sample is the run of consecutive members whose
names share a key, the path up to the first dot of the base name; the rest
of the name is the member's extension (``a/b.seg.png``: key ``a/b``,
extension ``seg.png``). Members without an extension, and entries that are
no regular file, belong to no sample. The shard is read once, front to
back, with the stdlib's stream mode (GNU long names and pax headers
included); only ``.cls`` members are read for their label.
"""
import os
import re
import tarfile
from typing import (BinaryIO, Dict, Iterator, NamedTuple, Optional, Sequence,
                    Tuple)

LABEL_EXT = 'cls'
#: The longest ``.cls`` member read as a label.
_LABEL_BYTES = 64
_KEY_EXT = re.compile(r'^((?:.*/|)[^.]+)[.]([^/]*)$')
# The first bytes of the compressions tarfile's 'r|*' would undo: their
# members' offsets are not offsets of the shard's bytes.
_COMPRESSED = {
    b'\x1f\x8b': 'gzip',
    b'BZh': 'bzip2',
    b'\xfd7zXZ': 'xz',
    b'\x28\xb5\x2f\xfd': 'zstd',
}
_TAIL_CHUNK = 1 << 16


class TarShardError(ValueError):
    """A shard is no readable, well-formed WebDataset tar."""


class ShardSample(NamedTuple):
    """One sample of a shard.

    Attributes:
        key: The members' common key.
        offset: Where its first member's header starts in the shard.
        spans: ``ext -> (offset of the member's data, its size)`` for the
            extensions asked for.
        label: The integer in its ``.cls`` member (None: not asked for).
    """
    key: str
    offset: int
    spans: Dict[str, tuple]
    label: Optional[int]


def iter_shard_samples(
        path: str,
        name: str,
        exts: Sequence[str],
        previous: Optional[Tuple[str, str]] = None) -> Iterator[ShardSample]:
    """The samples of the local tar file ``path``, in shard order.

    Args:
        path (str): A local copy of the shard.
        name (str): The shard as errors name it (its URL).
        exts (Sequence[str]): Extensions every sample must have; their
            members' spans are reported, the others' skipped.
        previous (tuple, optional): ``(shard, key)`` of the last sample of
            the shard before: a first sample with that key is one key split
            across two shards.

    Raises:
        TarShardError: Not an uncompressed tar, truncated or damaged, a
            sample whose members are not consecutive or split across
            shards, one with a member twice, or one without a member of
            ``exts``, naming the shard and the member or byte.
    """
    size = os.path.getsize(path)
    with open(path, 'rb') as file:
        _refuse_compressed(file.read(8), name)
        file.seek(0)
        try:
            tar = tarfile.open(fileobj=file, mode='r|')
        except tarfile.TarError as error:
            raise TarShardError(f'{name}: not a tar file ({error})') from None
        pending: Optional[_Pending] = None
        keys_seen = set()
        # Raised at the end: a sample incomplete here may have its other
        # members further on, which is the better error to give.
        incomplete: Optional[str] = None
        try:
            for member in tar:
                match = _KEY_EXT.match(member.name)
                if not member.isfile() or match is None:
                    continue
                key, ext = match.groups()
                if member.issparse():
                    # Its size is the expanded file's, not the bytes the
                    # shard holds: a span would run into the next member.
                    raise TarShardError(
                        f'{name}: member {member.name!r} at byte '
                        f'{member.offset} is a sparse file; repack it as a '
                        'regular one')
                if member.offset_data + member.size > size:
                    raise TarShardError(
                        f'{name}: truncated: member {member.name!r} at byte '
                        f'{member.offset} ends at byte '
                        f'{member.offset_data + member.size}, the shard at '
                        f'{size}')
                if pending is None and previous and key == previous[1]:
                    raise TarShardError(
                        f'{name}: sample {key!r} (from byte {member.offset}) '
                        f'continues the last sample of {previous[0]}: a key '
                        'split across two shards')
                if pending is None or key != pending.key:
                    if pending is not None:
                        incomplete = incomplete or pending.missing(name, exts)
                        if incomplete is None:
                            yield pending.sample()
                    if key in keys_seen:
                        raise TarShardError(
                            f'{name}: the members of sample {key!r} are not '
                            f'consecutive: {member.name!r} at byte '
                            f'{member.offset} follows other samples')
                    keys_seen.add(key)
                    pending = _Pending(key, member.offset)
                pending.add(member, ext, exts, tar, name)
        except tarfile.TarError as error:
            raise TarShardError(
                f'{name}: damaged or truncated tar after byte {tar.offset} '
                f'({error})') from None
        if pending is not None:
            incomplete = incomplete or pending.missing(name, exts)
        _check_end(file, tar.offset, name)
        if incomplete is not None:
            raise TarShardError(incomplete)
        if pending is not None:
            yield pending.sample()


class _Pending:
    """The sample whose members are being read."""

    def __init__(self, key: str, offset: int) -> None:
        self.key = key
        self.offset = offset
        self.spans: Dict[str, tuple] = {}
        self.label: Optional[int] = None
        self.exts_seen = set()

    def add(self, member: tarfile.TarInfo, ext: str, exts: Sequence[str],
            tar: tarfile.TarFile, name: str) -> None:
        if ext in self.exts_seen:
            raise TarShardError(
                f'{name}: sample {self.key!r} has two .{ext} members (the '
                f'second, {member.name!r}, at byte {member.offset})')
        self.exts_seen.add(ext)
        if ext not in exts:
            return
        self.spans[ext] = (member.offset_data, member.size)
        if ext == LABEL_EXT:
            # An integer label is a few bytes; a huge member named .cls is
            # not read into memory to find that out.
            text = tar.extractfile(member).read(_LABEL_BYTES + 1)
            try:
                if len(text) > _LABEL_BYTES:
                    raise ValueError(text)
                self.label = int(text.strip())
            except ValueError:
                raise TarShardError(
                    f'{name}: {member.name!r} at byte {member.offset} holds '
                    f'{text[:40]!r}, not an integer class label') from None

    def missing(self, name: str, exts: Sequence[str]) -> Optional[str]:
        """The error of a sample without a member of ``exts``, or None."""
        missing = [ext for ext in exts if ext not in self.spans]
        if not missing:
            return None
        return (f'{name}: sample {self.key!r} (from byte {self.offset}) has '
                f'no .{missing[0]} member; it has {sorted(self.exts_seen)}')

    def sample(self) -> ShardSample:
        return ShardSample(self.key, self.offset, self.spans, self.label)


def _refuse_compressed(head: bytes, name: str) -> None:
    for magic, kind in _COMPRESSED.items():
        if head.startswith(magic):
            raise TarShardError(
                f'{name}: a {kind}-compressed tar; members are read by '
                'their byte ranges, which only an uncompressed shard has. '
                'Repack it without compression (images are compressed '
                'already).')


def _check_end(file: BinaryIO, end: int, name: str) -> None:
    """After the last member only the end-of-archive zeros may follow, one
    512-byte block at least: a header the stream reader stopped at, or no
    end at all, means a cut or damaged shard."""
    file.seek(end)
    position = end
    while True:
        chunk = file.read(_TAIL_CHUNK)
        if not chunk:
            break
        rest = chunk.lstrip(b'\0')
        if rest:
            raise TarShardError(
                f'{name}: damaged or truncated tar: byte '
                f'{position + len(chunk) - len(rest)} starts no member '
                'header that can be read (a shard cut short or '
                'overwritten?)')
        position += len(chunk)
    if position - end < tarfile.BLOCKSIZE:
        raise TarShardError(
            f'{name}: truncated tar: it ends at byte {position} after a '
            'member, without the end-of-archive blocks (a shard cut short?)')
