import pytest
from mmengine import fileio

from mmdata_plugin.remote import (RemoteAccessDeniedError, RemoteNotFoundError,
                                  RemoteUnavailableError, S3Backend)
from mmdata_plugin.testing import MotoS3Server, find_free_port

OBJECTS = {
    f'data/{kind}/{i:02d}.bin': bytes((i * 13 + j) % 256
                                      for j in range(1500 + i))
    for kind in ('a', 'b') for i in range(8)
}
OBJECTS['data/top.txt'] = b'hello'


@pytest.fixture(scope='module')
def s3():
    with MotoS3Server() as server:
        server.put_objects('bucket', OBJECTS)
        yield server


def test_s3_prefix_routes_to_our_backend():
    assert isinstance(fileio.get_file_backend('s3://b/k'), S3Backend)


@pytest.mark.compat
def test_every_object_byte_exact(s3):
    args = s3.backend_args(backoff=0.01)
    for key, data in OBJECTS.items():
        assert fileio.get(f's3://bucket/{key}', backend_args=args) == data
    backend = fileio.get_file_backend(
        's3://bucket', backend_args=args, enable_singleton=True)
    key = 's3://bucket/data/a/03.bin'
    assert backend.get_range(key, 10, 100) == \
        OBJECTS['data/a/03.bin'][10:110]
    stat = backend.stat(key)
    assert stat.size == len(OBJECTS['data/a/03.bin']) and stat.etag
    assert backend.exists(key) and not backend.exists(key + '.missing')
    assert backend.isdir('s3://bucket/data/a')
    assert not backend.isdir('s3://bucket/data/zzz')
    assert sorted(backend.list_dir_or_file('s3://bucket/data')) == [
        'a', 'b', 'top.txt'
    ]
    assert sorted(
        backend.list_dir_or_file(
            's3://bucket/data/', list_dir=False, suffix='.bin',
            recursive=True)) == sorted(k[5:] for k in OBJECTS
                                       if k.endswith('.bin'))
    assert backend.join_path('s3://bucket/data', 'a', '00.bin') == \
        's3://bucket/data/a/00.bin'


def test_missing_objects_and_buckets_name_the_url(s3):
    backend = fileio.get_file_backend(
        's3://bucket', backend_args=s3.backend_args(backoff=0.01))
    with pytest.raises(RemoteNotFoundError, match='s3://bucket/data/nope'):
        backend.get('s3://bucket/data/nope')
    with pytest.raises(RemoteNotFoundError, match='NoSuchBucket.*s3://nob/x'):
        backend.get('s3://nob/x')


def test_bad_credentials_fail_at_once_naming_the_url(s3):
    args = s3.backend_args(backoff=0.01)
    args.update(aws_access_key_id='AKIAWRONG', aws_secret_access_key='nope')
    backend = fileio.get_file_backend('s3://bucket', backend_args=args)
    with s3.credentials_checked():
        with pytest.raises(RemoteAccessDeniedError,
                           match='InvalidAccessKeyId.*s3://bucket/data/top'):
            backend.get('s3://bucket/data/top.txt')
    assert backend.retry.retried == 0


def test_unreachable_endpoint_gives_up():
    backend = S3Backend(
        endpoint_url=f'http://127.0.0.1:{find_free_port()}',
        aws_access_key_id='k',
        aws_secret_access_key='s',
        region_name='us-east-1',
        retries=1,
        backoff=0.01,
        connect_timeout=1)
    with pytest.raises(RemoteUnavailableError,
                       match='gave up after 2 attempt.*s3://bucket/key'):
        backend.get('s3://bucket/key')


def _signing_user(s3):
    """backend_args of an IAM user moto knows: with credentials checked,
    moto verifies its requests' signatures."""
    import json

    import boto3
    args = s3.backend_args(backoff=0.01)
    iam = boto3.client(
        'iam',
        **{
            name: args[name]
            for name in ('endpoint_url', 'region_name', 'aws_access_key_id',
                         'aws_secret_access_key')
        })
    user = f'reader{len(iam.list_users()["Users"])}'
    iam.create_user(UserName=user)
    iam.put_user_policy(
        UserName=user,
        PolicyName='read',
        PolicyDocument=json.dumps(
            dict(Version='2012-10-17',
                 Statement=[dict(Effect='Allow', Action='s3:*',
                                 Resource='*')])))
    key = iam.create_access_key(UserName=user)['AccessKey']
    return dict(args, aws_access_key_id=key['AccessKeyId'],
                aws_secret_access_key=key['SecretAccessKey'])


def _count_boto_gets(backend):
    client, calls = backend.client.boto, []
    get_object = client.get_object

    def counted(**params):
        calls.append(params['Key'])
        return get_object(**params)

    client.get_object = counted
    return calls


def test_gets_are_signed_and_sent_over_kept_connections(s3):
    # moto refuses a signature boto3 makes for '+', '=', '&' or non-ASCII
    # in keys; these it checks and accepts.
    objects = {'signed/with space.bin': b'1' * 3000, 'signed/d/f~g.bin': b'2'}
    s3.put_objects('bucket', objects)
    args = _signing_user(s3)
    args.pop('backend')
    backend = S3Backend(**args)
    boto_gets = _count_boto_gets(backend)
    with s3.credentials_checked():
        for key, data in objects.items():
            assert backend.get(f's3://bucket/{key}') == data
            assert backend.get_range(f's3://bucket/{key}', 0, 1) == data[:1]
        wrong = S3Backend(**dict(args, aws_secret_access_key='wrong'))
        url = 's3://bucket/signed/d/f~g.bin'
        with pytest.raises(RemoteAccessDeniedError,
                           match=f'SignatureDoesNotMatch.*{url}'):
            wrong.get(url)
    assert boto_gets == [] and wrong.retry.retried == 0


def test_a_multipart_object_is_read_through_boto3(s3):
    # Its ETag is no MD5: botocore checks what it can while streaming.
    client = s3.client()
    data = bytes(range(256)) * 100
    upload = client.create_multipart_upload(Bucket='bucket', Key='multi.bin')
    part = client.upload_part(Bucket='bucket', Key='multi.bin', PartNumber=1,
                              UploadId=upload['UploadId'], Body=data)
    client.complete_multipart_upload(
        Bucket='bucket', Key='multi.bin', UploadId=upload['UploadId'],
        MultipartUpload=dict(Parts=[dict(ETag=part['ETag'], PartNumber=1)]))
    backend = fileio.get_file_backend(
        's3://bucket', backend_args=s3.backend_args(backoff=0.01))
    boto_gets = _count_boto_gets(backend)
    assert backend.get('s3://bucket/multi.bin') == data
    assert boto_gets == ['multi.bin']
    assert backend.get('s3://bucket/data/top.txt') == b'hello'
    assert boto_gets == ['multi.bin']
