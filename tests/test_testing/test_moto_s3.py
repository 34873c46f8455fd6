import botocore.exceptions
import pytest

from mmdata_plugin.testing import MotoS3Server


def test_moto_server_serves_s3_on_loopback():
    with MotoS3Server() as s3:
        assert s3.endpoint_url.startswith('http://127.0.0.1:')
        s3.put_objects('bucket', {'a/x.bin': b'0123456789'})
        client = s3.client()
        body = client.get_object(Bucket='bucket', Key='a/x.bin',
                                 Range='bytes=2-4')['Body'].read()
        assert body == b'234'
        head = client.head_object(Bucket='bucket', Key='a/x.bin')
        assert head['ContentLength'] == 10 and head['ETag']
        with s3.credentials_checked():
            with pytest.raises(botocore.exceptions.ClientError) as info:
                s3.client('AKIAWRONG', 'wrong').get_object(
                    Bucket='bucket', Key='a/x.bin')
            assert info.value.response['ResponseMetadata'][
                'HTTPStatusCode'] == 403
        # Authentication is off again after the block.
        assert client.get_object(Bucket='bucket',
                                 Key='a/x.bin')['Body'].read() == b'0123456789'
    # A new server starts empty.
    with MotoS3Server() as s3:
        assert s3.client().list_buckets()['Buckets'] == []
