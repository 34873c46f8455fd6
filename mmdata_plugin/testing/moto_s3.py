"""moto's S3 server on 127.0.0.1, for tests of S3 semantics (not speed).

moto answers the real S3 wire protocol (signatures, Range GET, ETag,
404/403 error documents), so boto3 code is exercised end to end; it serves
about 150 GET/s, which makes it a correctness stand-in only. Benchmarks use
:class:`~mmdata_plugin.testing.loopback_http.LoopbackHTTPServer`.
"""
import contextlib
from typing import Dict, Iterator, Mapping, Optional

# Credentials moto accepts while authentication is off (its default).
TEST_ACCESS_KEY = 'testing'
TEST_SECRET_KEY = 'testing'
TEST_REGION = 'us-east-1'


class MotoS3Server:
    """Start moto's ``ThreadedMotoServer`` on 127.0.0.1 with a free port.

    moto keeps its buckets in process-global state, so the server resets it
    on start: buckets of an earlier server never leak into this one.
    Requires ``moto[server]`` (the ``tests`` extra).

    Example:
        >>> with MotoS3Server() as s3:
        ...     s3.put_objects('data', {'a/x.bin': b'123'})
        ...     s3.backend_args()  # for fileio / configs
    """

    def __init__(self) -> None:
        self._server = None
        self.endpoint_url: Optional[str] = None

    def start(self) -> 'MotoS3Server':
        import logging

        from moto.server import ThreadedMotoServer

        # werkzeug logs every request at INFO to stderr; benchmarks and test
        # logs need none of it.
        logging.getLogger('werkzeug').setLevel(logging.WARNING)
        self._server = ThreadedMotoServer(
            ip_address='127.0.0.1', port=0, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint_url = f'http://{host}:{port}'
        self._post('/moto-api/reset', b'')
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop()

    def __enter__(self) -> 'MotoS3Server':
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def client(self,
               access_key: str = TEST_ACCESS_KEY,
               secret_key: str = TEST_SECRET_KEY):
        """A boto3 S3 client talking to this server."""
        import boto3
        return boto3.client(
            's3',
            endpoint_url=self.endpoint_url,
            aws_access_key_id=access_key,
            aws_secret_access_key=secret_key,
            region_name=TEST_REGION)

    def put_objects(self, bucket: str, objects: Mapping[str, bytes]) -> None:
        """Create ``bucket`` if needed and upload ``key -> bytes``."""
        client = self.client()
        existing = {b['Name'] for b in client.list_buckets()['Buckets']}
        if bucket not in existing:
            client.create_bucket(Bucket=bucket)
        for key, data in objects.items():
            client.put_object(Bucket=bucket, Key=key, Body=data)

    def backend_args(self, **extra) -> Dict:
        """``backend_args`` that make mmengine's fileio read from here."""
        return dict(
            backend='s3',
            endpoint_url=self.endpoint_url,
            aws_access_key_id=TEST_ACCESS_KEY,
            aws_secret_access_key=TEST_SECRET_KEY,
            region_name=TEST_REGION,
            **extra)

    @contextlib.contextmanager
    def credentials_checked(self) -> Iterator[None]:
        """Make the server reject unknown access keys (403) inside the block.

        moto checks credentials only when asked to; as no IAM user exists,
        every signed request is then refused, as with a wrong key on AWS.
        """
        self._post('/moto-api/reset-auth', b'0')
        try:
            yield
        finally:
            self._post('/moto-api/reset-auth', b'inf')

    def _post(self, path: str, data: bytes) -> None:
        import urllib.request
        # Not form-encoded: Flask would swallow the body as a form.
        request = urllib.request.Request(
            self.endpoint_url + path, data=data, method='POST',
            headers={'Content-Type': 'text/plain'})
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()
