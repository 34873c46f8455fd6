"""Coalesced reads: neighbouring tar members fetched with one range GET.

Packed data (``tarmember://`` paths, see
:mod:`~mmdata_plugin.remote.tar_member_backend`) puts many samples in one
remote object; one range GET per member pays a request's latency for
~100 KB. The node prefetcher groups the members it decides to download in
one round that lie close together in the same shard version
(:class:`RoundSpans`): each group is read with one range GET of its
covering span (:class:`SharedSpan`), fetched by the first member whose
entry is produced, and every member's entry is produced from its slice,
each through the store's own reservation, key lock and publication, as a
member's own GET would be. A group's downloads run in turn on one thread
(:func:`in_turn`): spread over a pool, the members queued behind other
requests would be read on demand, one GET each, by readers reaching them
first.

Verified: the covering span is a ``tarmember://`` read itself (the shard's
size and ETag of the member paths, the span's length), and a member's
slice must lie inside the span and have the member's length; a member that
fails gets no entry (its reader reads it on demand).
"""
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

from ..cache.key_locks import KeyHolds
from ..remote.errors import RemoteIOError
from ..remote.tar_member_backend import (MemberPathError, member_path,
                                         parse_member_path)


class CoalesceLimits(NamedTuple):
    """Which members one request may cover.

    Attributes:
        max_gap: Most bytes between two members of a group (tar headers,
            members nobody downloads now): read and thrown away.
        max_span: Most bytes one request covers, gaps included (held in
            memory until its members are written).
    """
    max_gap: int
    max_span: int


class _Read:
    """One range GET of a span: bytes ``[start, end)`` of its shard
    version, read on first use; a failed read is kept, not repeated."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.span = parse_member_path(path)
        self.data: Optional[bytes] = None
        self.error: Optional[BaseException] = None

    def covers(self, member) -> bool:
        cover = self.span
        return ((member.shard, member.size, member.tag)
                == (cover.shard, cover.size, cover.tag)
                and cover.start <= member.start and member.start +
                member.length <= cover.start + cover.length)

    def bytes(self, read: Callable[[str], bytes]) -> Tuple[bytes, int]:
        """The span's bytes and how many of them this call read."""
        if self.error is not None:
            raise self.error
        if self.data is not None:
            return self.data, 0
        try:
            self.data = read(self.path)
        except Exception as error:
            self.error = error
            raise
        return self.data, len(self.data)


class SharedSpan:
    """Bytes ``[start, end)`` of one shard version, read once for the
    members inside them, by the one thread that produces their entries in
    turn. A failed read is not repeated for the other members (each
    raises it; their readers read on demand).

    The thread holds its members' keys (:meth:`claim`) from before the
    read until each member is published: a reader reaching a member
    meanwhile waits for the span's bytes (in memory by then, or on their
    way) instead of reading them again with a GET of its own. Members
    present or held by another producer when the span is claimed are left
    to them, and not read again: the span's bytes are cut to the members
    held, in one request per run of them that ``max_gap`` joins, as the
    round joined them.

    Args:
        path (str): The ``tarmember://`` path of the covering span.
        max_gap (int): Most bytes between two members of one request.
    """

    def __init__(self, path: str, max_gap: int) -> None:
        self.path = path
        self.max_gap = max_gap
        self.holds: Optional[KeyHolds] = None
        self._reads = [_Read(path)]
        self._uncounted = 0
        self._let_go_at = float('inf')

    def claim(self, holds: KeyHolds, held: List[str],
              hold_for: float) -> None:
        """Produce only the members ``holds`` holds, ``held`` their paths,
        read in runs within ``max_gap`` of each other; hold them at most
        ``hold_for`` seconds (see :meth:`let_go_if_late`)."""
        members = sorted((parse_member_path(url) for url in held),
                         key=lambda member: member.start)
        runs: List[List[int]] = []
        for member in members:
            end = member.start + member.length
            if runs and member.start - runs[-1][1] <= self.max_gap:
                runs[-1][1] = max(runs[-1][1], end)
            else:
                runs.append([member.start, end])
        cover = self._reads[0].span
        reads = [
            _Read(member_path(cover.shard, start, end - start, cover.size,
                              cover.tag)) for start, end in runs
        ]
        # Set together, once nothing can fail: a span whose claim failed
        # is read as an unclaimed one.
        self.holds, self._reads = holds, reads
        self._let_go_at = time.monotonic() + hold_for

    def let_go(self) -> None:
        """Release the members' keys not published yet (the rest of the
        span is not produced: their readers read them)."""
        if self.holds is not None:
            self.holds.close()

    def let_go_if_late(self) -> None:
        """:meth:`let_go` once the keys have been held ``hold_for``
        seconds (the room wait): members produced in turn, each of which
        may wait for room, keep the readers of those after them waiting no
        longer than that (and one member's production); after a member
        found no room, the rest are not tried."""
        if time.monotonic() > self._let_go_at:
            self.let_go()

    def member_bytes(self, url: str, read: Callable[[str], bytes]) -> bytes:
        """The bytes of member ``url``, cut from the span's request that
        covers it, which ``read`` (a fileio ``get``) fetches on the first
        call.

        Raises:
            RemoteIOError: ``url`` is no member of the span, or its slice
                is not the member's length (never another member's bytes).
        """
        member = parse_member_path(url)
        request = next((r for r in self._reads if r.covers(member)), None)
        if request is None:
            raise RemoteIOError(url, f'not inside the span {self.path}')
        data, fresh = request.bytes(read)
        self._uncounted += fresh
        offset = member.start - request.span.start
        piece = data[offset:offset + member.length]
        if len(piece) != member.length:
            raise RemoteIOError(
                url, f'{len(piece)} of the member\'s {member.length} bytes '
                f'in the {len(data)} bytes read of {request.path}')
        return piece

    def take_read_bytes(self) -> int:
        """Bytes read from the remote not counted yet: each request's
        whole span, gaps included, once (to the member whose call read
        it)."""
        count, self._uncounted = self._uncounted, 0
        return count


class _Group:
    """The members of one round that one request covers, and how many of
    its downloads have not ended (the request is in flight until none)."""

    def __init__(self, start: int, end: int) -> None:
        self.start = start
        self.end = end
        self.urls = 0
        self.pending = 0
        self.span: Optional[SharedSpan] = None

    def ended_one(self) -> bool:
        """Book a download of the group as ended; whether it was the last."""
        self.pending -= 1
        return self.pending == 0


class RoundSpans:
    """Groups the downloads of one prefetcher round into requests.

    A download (one sample's files) joins a group of the same shard
    version when its members lie within ``max_gap`` bytes of the group's
    span and the span grows to at most ``max_span``; a download whose
    files are not all remote tar members of one shard is a request of its
    own. Call :meth:`close` when the round's downloads are decided.

    Args:
        limits (CoalesceLimits): The gap and span limits.
    """

    def __init__(self, limits: CoalesceLimits) -> None:
        self.limits = limits
        self._open: Dict[tuple, List[_Group]] = {}
        # Requests so far that covered more than one member.
        self.coalesced = 0

    def join(self, urls: List[str]) -> Tuple[Optional[_Group], bool]:
        """The group ``urls`` joins (None: a request of its own) and
        whether it opened that group (a new request)."""
        extent = _extent(urls)
        if extent is None:
            return None, True
        key, start, end = extent
        group = self._near(key, start, end)
        if group is not None:
            group.start = min(group.start, start)
            group.end = max(group.end, end)
            group.urls += len(urls)
            group.pending += 1
            return group, False
        group = _Group(start, end)
        group.urls, group.pending = len(urls), 1
        self._open.setdefault(key, []).append(group)
        return group, True

    def _near(self, key: tuple, start: int, end: int) -> Optional[_Group]:
        """The open group that members at ``[start, end)`` of shard
        version ``key`` may join within the limits."""
        for group in self._open.get(key, ()):
            near = (start - group.end <= self.limits.max_gap
                    and group.start - end <= self.limits.max_gap)
            span = max(group.end, end) - min(group.start, start)
            if near and span <= self.limits.max_span:
                return group
        return None

    def close(self) -> None:
        """Give each group of more than one member its :class:`SharedSpan`
        (a single member reads itself); start the next round."""
        for key, groups in self._open.items():
            shard, size, tag = key
            for group in groups:
                if group.urls > 1:
                    self.coalesced += 1
                    group.span = SharedSpan(
                        member_path(shard, group.start,
                                    group.end - group.start, size, tag),
                        self.limits.max_gap)
        self._open = {}


def in_turn(items: List[Any],
            span_of: Callable[[Any], Optional[Any]]) -> List[List[Any]]:
    """``items`` as the lists one thread runs in turn: the items of one
    span (``span_of(item)``, None: none) together, each other alone; in
    their order."""
    runs: List[List[Any]] = []
    of_span: Dict[Any, List[Any]] = {}
    for item in items:
        span = span_of(item)
        if span is None:
            runs.append([item])
        elif span in of_span:
            of_span[span].append(item)
        else:
            of_span[span] = [item]
            runs.append(of_span[span])
    return runs


def _extent(urls: List[str]) -> Optional[tuple]:
    """``((shard, size, tag), start, end)`` of ``urls`` when all are
    members of one remote shard version; None otherwise."""
    key, start, end = None, None, None
    for url in urls:
        try:
            member = parse_member_path(url)
        except MemberPathError:
            return None
        version = (member.shard, member.size, member.tag)
        if not member.remote or key not in (None, version):
            return None
        key = version
        start = member.start if start is None else min(start, member.start)
        end = max(end or 0, member.start + member.length)
    return None if key is None else (key, start, end)
