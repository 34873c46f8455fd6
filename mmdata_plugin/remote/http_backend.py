"""http(s):// objects through a pooled, keep-alive urllib3 client."""
import re
from typing import Dict, Optional, Tuple
from urllib.parse import urlsplit

import urllib3
from urllib3.exceptions import HTTPError as Urllib3Error
from urllib3.exceptions import MaxRetryError, ProtocolError, SSLError

from .errors import (RemoteIOError, RemoteUnavailableError, RetryableError,
                     error_for_status)
from .remote_backend import CHUNK_SIZE, RemoteBackend, RemoteBody, RemoteStat

_CONTENT_RANGE = re.compile(r'bytes (\d+)-(\d+)/(\d+|\*)')
# Answers that the pool manager follows (to any host).
_REDIRECTS = frozenset((301, 302, 303, 307, 308))


class HTTPRemoteBackend(RemoteBackend):
    """Read http:// and https:// objects, for mmengine's fileio.

    Registered as backend ``'remote_http'`` and for the ``http``/``https``
    prefixes, so ``fileio.get('https://...')`` and every transform with a
    URL path use it; mmengine's bare ``urlopen`` backend stays available as
    ``backend_args=dict(backend='http')``.

    One urllib3 pool per process keeps connections alive between requests
    (no TCP/TLS handshake per sample). Responses are streamed and checked
    against their ``Content-Length``; 5xx, 408, 429, timeouts, resets,
    refused connections and truncated bodies are retried with jittered
    exponential backoff; 404/401/403 fail at once, naming the URL.

    Args:
        headers (dict, optional): Sent with every request, e.g.
            ``{'Authorization': 'Bearer ...'}`` (put secrets in environment
            variables: ``'{{$TOKEN:}}'`` in an mmengine config; mmengine
            substitutes only with the ``:``).
        pool_maxsize (int): Connections kept per host and process. Raise it
            when many threads of one process read at once.
        verify (bool): Check TLS certificates.
        ca_certs (str, optional): CA bundle for private endpoints.
        **kwargs: ``timeout``, ``connect_timeout``, ``retries``, ``backoff``,
            ``max_backoff`` (see :class:`RemoteBackend`).
    """

    def __init__(self,
                 headers: Optional[Dict[str, str]] = None,
                 pool_maxsize: int = 16,
                 verify: bool = True,
                 ca_certs: Optional[str] = None,
                 **kwargs) -> None:
        super().__init__(**kwargs)
        self.headers = dict(headers or {})
        self.pool_maxsize = pool_maxsize
        self.verify = verify
        self.ca_certs = ca_certs
        self._pools: Optional[Dict[Tuple[str, str],
                                   'urllib3.HTTPConnectionPool']] = None
        self._pools_client = None

    def _new_client(self) -> urllib3.PoolManager:
        return urllib3.PoolManager(
            num_pools=16,
            maxsize=self.pool_maxsize,
            block=False,
            headers=self.headers,
            timeout=urllib3.Timeout(
                connect=self.connect_timeout, read=self.timeout),
            # Our RetryPolicy retries (with backoff, over whole bodies);
            # urllib3 only follows redirects.
            retries=urllib3.Retry(
                total=None,
                connect=0,
                read=0,
                other=0,
                status=0,
                redirect=5,
                raise_on_status=False),
            cert_reqs='CERT_REQUIRED' if self.verify else 'CERT_NONE',
            ca_certs=self.ca_certs)

    def _host_pool(self, url: str) -> Tuple[
            'urllib3.HTTPConnectionPool', str]:
        """The connection pool of ``url``'s host and the request target.

        Asked of the pool directly: the pool manager's per-request URL
        parsing, pool-key normalization and redirect bookkeeping cost
        about as much CPU as reading a 100 KB body (issue 22, item 4).
        """
        parts = urlsplit(url)
        pools = self._pools
        if pools is None or self._pools_client is not self.client:
            pools = self._pools = {}
            self._pools_client = self.client
        origin = (parts.scheme, parts.netloc)
        pool = pools.get(origin)
        # A pool the manager dropped (more hosts than num_pools) is closed.
        if pool is None or pool.pool is None:
            pool = pools[origin] = self.client.connection_from_url(url)
        target = parts.path or '/'
        if parts.query:
            target += '?' + parts.query
        return pool, target

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state.update(_pools=None, _pools_client=None)
        return state

    def _request(self, method: str, url: str,
                 headers: Dict[str, str]) -> 'urllib3.HTTPResponse':
        headers = {**self.headers, **headers}
        try:
            pool, target = self._host_pool(url)
            response = pool.urlopen(
                method,
                target,
                headers=headers,
                redirect=False,
                preload_content=False,
                decode_content=False,
                enforce_content_length=True)
            if response.status not in _REDIRECTS:
                return response
            response.drain_conn()
            response.release_conn()
            # The manager follows the redirect, to any host.
            return self.client.request(
                method,
                url,
                headers=headers,
                preload_content=False,
                decode_content=False,
                enforce_content_length=True)
        except MaxRetryError as error:
            if isinstance(error.reason, urllib3.exceptions.ResponseError):
                # A redirect loop: the same chain on every try.
                raise RemoteIOError(url, f'{error.reason}') from None
            raise _classify(url, error.reason or error) from None
        except Urllib3Error as error:
            raise _classify(url, error) from None

    def _head(self, url: str) -> RemoteStat:
        response = self._request('HEAD', url, {})
        response.release_conn()
        if response.status in (405, 501):
            # HEAD not allowed: a 1-byte range GET tells the size as well.
            body = self._open(url, (0, 1))
            body.close(False)
            size, etag = (None if body.size < 0 else body.size), body.etag
        elif response.status != 200:
            raise error_for_status(url, response.status)
        else:
            size = response.headers.get('Content-Length')
            etag = response.headers.get('ETag')
        if size is None:
            raise RemoteIOError(url, 'the server sent no Content-Length')
        return RemoteStat(int(size), etag)

    def _open(self, url: str, span: Optional[Tuple[int, int]]) -> RemoteBody:
        headers = {}
        if span is not None:
            headers['Range'] = f'bytes={span[0]}-{span[0] + span[1] - 1}'
        response = self._request('GET', url, headers)
        if response.status not in (200, 206):
            detail = response.reason or ''
            response.drain_conn()
            response.release_conn()
            raise error_for_status(url, response.status, detail)
        length_header = response.headers.get('Content-Length')
        length = int(length_header) if length_header is not None else None
        start, size = 0, length
        if response.status == 206:
            match = _CONTENT_RANGE.fullmatch(
                response.headers.get('Content-Range', ''))
            if match is None or match.group(3) == '*':
                response.close()
                raise RemoteIOError(
                    url, 'a range answer without a usable Content-Range '
                    f'({response.headers.get("Content-Range")!r})')
            start, size = int(match.group(1)), int(match.group(3))
        if size is None:
            size = -1  # chunked answer: urllib3 still detects truncation

        def close(complete: bool) -> None:
            if not complete:
                response.close()
            response.release_conn()

        return RemoteBody(size, response.headers.get('ETag'), start, length,
                          _stream(url, response), close)


def _stream(url: str, response):
    try:
        yield from response.stream(CHUNK_SIZE)
    except Urllib3Error as error:
        raise _classify(url, error) from None


def _classify(url: str, error: Exception) -> Exception:
    """Retry network trouble; stop at once on TLS or URL mistakes."""
    if isinstance(error, SSLError):
        return RemoteUnavailableError(url, f'TLS error: {error}')
    if isinstance(error, (urllib3.exceptions.LocationValueError,
                          urllib3.exceptions.LocationParseError)):
        return RemoteIOError(url, f'not a valid URL ({error})')
    kind = 'connection broken' if isinstance(error, ProtocolError) \
        else type(error).__name__
    return RetryableError(f'{kind}: {error}')
