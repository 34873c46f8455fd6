"""SampleFiles: the files each sample reads, and path keys that name none."""
import pytest

from mmdata_plugin.remote_cache.pipeline_routing import SampleFiles


class Infos:

    def __init__(self, infos):
        self.infos = infos

    def __len__(self):
        return len(self.infos)

    def get_data_info(self, index):
        return dict(self.infos[index])


def test_files_of_a_sample():
    files = SampleFiles(
        Infos([dict(img_path='s3://b/0.jpg', seg_map_path=None),
               dict(img_path='s3://b/1.jpg', seg_map_path='s3://b/1.png')]),
        ('img_path', 'seg_map_path'))
    assert files(0) == ['s3://b/0.jpg']
    assert files(1) == ['s3://b/1.jpg', 's3://b/1.png']
    files.check_keys('RemoteCachePrefetchHook.path_keys')


def test_path_keys_that_name_no_file_are_refused():
    files = SampleFiles(Infos([dict(filename='s3://b/0.jpg', label=3)] * 20),
                        ('img_path', ))
    with pytest.raises(ValueError) as error:
        files.check_keys('RemoteCachePrefetchHook.path_keys')
    message = str(error.value)
    assert "RemoteCachePrefetchHook.path_keys=['img_path']" in message
    assert "['filename', 'label']" in message and 'first 16' in message


def test_image_files_a_head_serves_are_not_read_other_files_are():
    served = {'s3://b/1.jpg', 's3://b/1.png'}
    files = SampleFiles(
        Infos([dict(img_path='s3://b/0.jpg', seg_map_path='s3://b/0.png'),
               dict(img_path='s3://b/1.jpg', seg_map_path='s3://b/1.png')]),
        ('img_path', 'seg_map_path'), head_serves=served.__contains__)
    assert files(0) == ['s3://b/0.jpg', 's3://b/0.png']
    # The head's entry stands in for the image only: a segmentation map
    # read after the head is still read, served or not.
    assert files(1) == ['s3://b/1.png']
    assert files.files(1) == ['s3://b/1.jpg', 's3://b/1.png']
    # A warm head is no sign of path keys naming nothing.
    SampleFiles(Infos([dict(img_path='s3://b/1.jpg')] * 20), ('img_path', ),
                head_serves=served.__contains__).check_keys('path_keys')
