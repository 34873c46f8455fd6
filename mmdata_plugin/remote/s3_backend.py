"""s3:// objects through boto3: AWS S3, MinIO, Ceph RGW and other S3 APIs."""
import re
from typing import Any, Iterator, NamedTuple, Optional, Tuple, Union
from urllib.parse import quote

from .errors import (RemoteAccessDeniedError, RemoteCorruptError,
                     RemoteIOError, RetryableError, error_for_status)
from .http_backend import HTTPRemoteBackend, range_headers
from .remote_backend import (CHUNK_SIZE, RemoteBackend, RemoteBody,
                             RemoteStat, is_md5_etag)

_ERROR_CODE = re.compile(rb'<Code>([^<]{1,64})</Code>')


class S3Client(NamedTuple):
    """What one process reads S3 with.

    Attributes:
        boto: The boto3 client (metadata, listings, and GETs it must do).
        credentials: botocore's credentials that sign the lean GETs (None:
            unsigned, or none found: boto3 then says what is missing).
        lean (HTTPRemoteBackend, optional): Keep-alive connections to the
            endpoint for GETs (None: every GET through boto3).
    """
    boto: Any
    credentials: Any
    lean: Optional[HTTPRemoteBackend]


class S3Backend(RemoteBackend):
    """Read ``s3://bucket/key`` objects, for mmengine's fileio.

    Registered as backend ``'s3'``; it also serves the ``s3://`` prefix
    unless SenseTime's ``petrel_client`` is installed (then mmengine's
    ``PetrelBackend`` keeps the prefix and this backend is chosen with
    ``backend_args=dict(backend='s3', ...)``).

    Credentials come from ``backend_args`` when given, else from boto3's
    usual chain (environment, ``~/.aws``, instance roles). One boto3 client
    per process (a forked DataLoader worker makes its own). boto3's own
    retries are off: ours retry 5xx, SlowDown, timeouts, resets and
    truncated bodies with jittered backoff, and fail at once on NoSuchKey,
    AccessDenied or bad credentials, naming the URL.

    With path-style addressing (the default with an ``endpoint_url``) an
    object's GET is signed with botocore's SigV4 signer and sent over the
    HTTP backend's keep-alive connections: boto3's request and response
    machinery costs ~2.5 ms of CPU per GET, ten times the rest of a 100 KB
    download. An object whose ETag is no MD5 (multipart) is read through
    boto3 after all, which checks its ``x-amz-checksum-*`` as it streams.

    Args:
        endpoint_url (str, optional): For MinIO, Ceph or another S3 API,
            e.g. ``'http://minio.local:9000'``; None for AWS.
        region_name (str, optional): Region (AWS); most others ignore it.
        aws_access_key_id (str, optional): Key id (else boto3's chain).
        aws_secret_access_key (str, optional): Secret key.
        aws_session_token (str, optional): For temporary credentials.
        profile_name (str, optional): A profile of ``~/.aws/config``.
        anonymous (bool): Unsigned requests, for public buckets.
        addressing_style (str, optional): ``'path'`` or ``'virtual'``.
            Default: ``'path'`` with an ``endpoint_url`` (what MinIO and
            Ceph expect), boto3's choice otherwise.
        pool_maxsize (int): Connections kept per process.
        verify (bool | str): Check TLS certificates (or a CA bundle path).
        **kwargs: ``timeout``, ``connect_timeout``, ``retries``, ``backoff``,
            ``max_backoff`` (see :class:`RemoteBackend`).
    """

    def __init__(self,
                 endpoint_url: Optional[str] = None,
                 region_name: Optional[str] = None,
                 aws_access_key_id: Optional[str] = None,
                 aws_secret_access_key: Optional[str] = None,
                 aws_session_token: Optional[str] = None,
                 profile_name: Optional[str] = None,
                 anonymous: bool = False,
                 addressing_style: Optional[str] = None,
                 pool_maxsize: int = 16,
                 verify: Union[bool, str] = True,
                 **kwargs) -> None:
        super().__init__(**kwargs)
        try:
            import boto3  # noqa: F401
        except ImportError as error:
            raise ImportError(
                's3:// paths need boto3: pip install "mmdata_plugin[s3]" '
                '(or pip install boto3)') from error
        self.endpoint_url = endpoint_url
        self.region_name = region_name
        self.credentials = dict(
            aws_access_key_id=aws_access_key_id,
            aws_secret_access_key=aws_secret_access_key,
            aws_session_token=aws_session_token)
        self.profile_name = profile_name
        self.anonymous = anonymous
        self.addressing_style = addressing_style or (
            'path' if endpoint_url else 'auto')
        self.pool_maxsize = pool_maxsize
        self.verify = verify

    def _new_client(self) -> S3Client:
        import boto3
        import botocore
        from botocore.config import Config
        session = boto3.session.Session(
            region_name=self.region_name,
            profile_name=self.profile_name,
            **self.credentials)
        config = Config(
            connect_timeout=self.connect_timeout,
            read_timeout=self.timeout,
            retries=dict(mode='standard', total_max_attempts=1),
            max_pool_connections=self.pool_maxsize,
            s3=dict(addressing_style=self.addressing_style),
            signature_version=botocore.UNSIGNED if self.anonymous else None)
        client = session.client(
            's3',
            endpoint_url=self.endpoint_url,
            config=config,
            verify=self.verify)
        lean = None
        if self.addressing_style == 'path':
            lean = HTTPRemoteBackend(
                pool_maxsize=self.pool_maxsize,
                verify=bool(self.verify),
                ca_certs=self.verify if isinstance(self.verify, str) else
                None,
                timeout=self.timeout,
                connect_timeout=self.connect_timeout)
        credentials = None if self.anonymous else session.get_credentials()
        return S3Client(client, credentials, lean)

    def _call(self, url: str, method: str, **params):
        try:
            return getattr(self.client.boto, method)(**params)
        except Exception as error:
            raise _classify(url, error) from None

    def _head(self, url: str) -> RemoteStat:
        bucket, key = split_s3_url(url)
        answer = self._call(url, 'head_object', Bucket=bucket, Key=key)
        return RemoteStat(int(answer['ContentLength']), answer.get('ETag'))

    def _open(self, url: str, span: Optional[Tuple[int, int]]) -> RemoteBody:
        bucket, key = split_s3_url(url)
        client = self.client
        if client.lean is not None and (self.anonymous
                                        or client.credentials is not None):
            body = self._open_lean(client, url, bucket, key, span)
            if is_md5_etag(body.etag):
                return body
            body.close(False)  # not verifiable here: boto3 checks its sums
        return self._open_boto(url, bucket, key, span)

    def _open_lean(self, client: S3Client, url: str, bucket: str, key: str,
                   span: Optional[Tuple[int, int]]) -> RemoteBody:
        """The GET of ``s3://bucket/key``, path-style, signed by botocore."""
        endpoint = client.boto.meta.endpoint_url.rstrip('/')
        target = f'{endpoint}/{bucket}/{quote(key, safe="/~")}'
        headers = range_headers(span)
        if client.credentials is not None:
            from botocore.auth import S3SigV4Auth
            from botocore.awsrequest import AWSRequest
            request = AWSRequest(method='GET', url=target, headers=headers)
            S3SigV4Auth(client.credentials.get_frozen_credentials(), 's3',
                        client.boto.meta.region_name).add_auth(request)
            headers = dict(request.headers.items())
        return client.lean.open_body(url, target, headers, _answer_error)

    def _open_boto(self, url: str, bucket: str, key: str,
                   span: Optional[Tuple[int, int]]) -> RemoteBody:
        params = dict(Bucket=bucket, Key=key, **range_headers(span))
        answer = self._call(url, 'get_object', **params)
        length = int(answer['ContentLength'])
        start, size = 0, length
        content_range = answer.get('ContentRange')
        if content_range:
            first, total = content_range.split()[-1].split('/')
            start, size = int(first.split('-')[0]), int(total)
        stream = answer['Body']

        def close(complete: bool) -> None:
            stream.close()

        return RemoteBody(size, answer.get('ETag'), start, length,
                          _chunks(url, stream), close)

    # --------------------------------------------------- directories
    def isdir(self, filepath) -> bool:
        bucket, key = split_s3_url(str(filepath), allow_empty_key=True)
        prefix = key.rstrip('/') + '/' if key else ''
        answer = self._list_page(str(filepath), bucket, prefix, None, None, 1)
        return answer.get('KeyCount', 0) > 0

    def list_dir_or_file(self,
                         dir_path,
                         list_dir: bool = True,
                         list_file: bool = True,
                         suffix: Union[str, Tuple[str, ...], None] = None,
                         recursive: bool = False) -> Iterator[str]:
        """Like mmengine's ``LocalBackend.list_dir_or_file``, over keys.

        Paths are relative to ``dir_path``; "directories" are key prefixes
        ending in '/'.
        """
        if list_dir and suffix is not None:
            raise TypeError('`suffix` should be None when `list_dir` is True')
        url = str(dir_path)
        bucket, key = split_s3_url(url, allow_empty_key=True)
        prefix = key.rstrip('/') + '/' if key else ''
        seen_dirs = set()
        token = None
        while True:
            answer = self._list_page(url, bucket, prefix,
                                     None if recursive else '/', token, 1000)
            for common in answer.get('CommonPrefixes', []):
                if list_dir:
                    yield common['Prefix'][len(prefix):].rstrip('/')
            for item in answer.get('Contents', []):
                relative = item['Key'][len(prefix):]
                if not relative or relative.endswith('/'):
                    continue
                if list_dir and recursive:
                    parts = relative.split('/')[:-1]
                    for depth in range(1, len(parts) + 1):
                        folder = '/'.join(parts[:depth])
                        if folder not in seen_dirs:
                            seen_dirs.add(folder)
                            yield folder
                if list_file and (suffix is None or relative.endswith(suffix)):
                    yield relative
            token = answer.get('NextContinuationToken')
            if not answer.get('IsTruncated') or token is None:
                return

    def _list_page(self, url, bucket, prefix, delimiter, token, max_keys):
        params = dict(Bucket=bucket, Prefix=prefix, MaxKeys=max_keys)
        if delimiter:
            params['Delimiter'] = delimiter
        if token:
            params['ContinuationToken'] = token

        def attempt():
            self.requests_made += 1
            return self._call(url, 'list_objects_v2', **params)

        return self.retry.call(attempt, url)


def split_s3_url(url: str, allow_empty_key: bool = False) -> Tuple[str, str]:
    """``'s3://bucket/a/b'`` -> ``('bucket', 'a/b')``."""
    scheme, sep, rest = url.partition('://')
    bucket, _, key = rest.partition('/')
    if not sep or scheme.split(':')[-1] != 's3' or not bucket or (
            not key and not allow_empty_key):
        raise RemoteIOError(url, 'not an s3://bucket/key URL')
    return bucket, key


def _chunks(url: str, stream) -> Iterator[bytes]:
    try:
        yield from stream.iter_chunks(CHUNK_SIZE)
    except Exception as error:
        raise _classify(url, error) from None


# S3 error codes meaning "the credentials are the problem" (some arrive as
# 400, not 403).
_CREDENTIAL_CODES = ('AccessDenied', 'InvalidAccessKeyId',
                     'SignatureDoesNotMatch', 'ExpiredToken', 'InvalidToken',
                     'TokenRefreshRequired', 'AuthorizationHeaderMalformed')
_RETRYABLE_CODES = ('SlowDown', 'InternalError', 'ServiceUnavailable',
                    'RequestTimeout', 'Throttling', 'ThrottlingException')


def _error_of_code(url: str, code: str, status: int) -> Exception:
    """What an S3 error answer (its code and HTTP status) means."""
    if code in _CREDENTIAL_CODES:
        return RemoteAccessDeniedError(
            url, f'access denied (S3 {code}): check the credentials in '
            'backend_args or the environment')
    if code in _RETRYABLE_CODES:
        return RetryableError(f'S3 {code} (HTTP {status})')
    return error_for_status(url, status, code)


def _answer_error(url: str, status: int, reason: str,
                  page: bytes) -> Exception:
    """The error of a lean GET's answer: by the code of S3's error
    document, as boto3 would raise it (by the status if there is none)."""
    match = _ERROR_CODE.search(page)
    code = match.group(1).decode('latin-1') if match else ''
    return _error_of_code(url, code, status)


def _classify(url: str, error: Exception) -> Exception:
    import botocore.exceptions as boto_errors
    if isinstance(error, boto_errors.ClientError):
        return _error_of_code(
            url,
            error.response.get('Error', {}).get('Code', ''),
            error.response.get('ResponseMetadata',
                               {}).get('HTTPStatusCode', 0))
    if isinstance(error, boto_errors.FlexibleChecksumError):
        # botocore checks the x-amz-checksum-* an object carries as the
        # body streams in.
        return RemoteCorruptError(url, f'{error}: damaged in transit')
    if isinstance(error, (boto_errors.NoCredentialsError,
                          boto_errors.PartialCredentialsError)):
        return RemoteAccessDeniedError(
            url, f'{error}: set aws_access_key_id/aws_secret_access_key in '
            'backend_args, the AWS_* environment variables or ~/.aws, or '
            'anonymous=True for a public bucket')
    retryable = (boto_errors.ConnectionError, boto_errors.HTTPClientError,
                 boto_errors.IncompleteReadError)
    try:
        import urllib3.exceptions
        retryable += (urllib3.exceptions.HTTPError, )
    except ImportError:  # pragma: no cover - botocore depends on urllib3
        pass
    if isinstance(error, retryable):
        return RetryableError(f'{type(error).__name__}: {error}')
    return RemoteIOError(url, f'{type(error).__name__}: {error}')
