import numpy as np
import pytest
import torch

from mmdata_plugin.transforms import PackImageLabelInputs, RandomImageCrop


def test_random_crop_is_seeded_by_numpy_and_pads_small_images():
    img = np.arange(20 * 30 * 3, dtype=np.uint8).reshape(20, 30, 3)
    crop = RandomImageCrop(crop_size=(8, 12))
    np.random.seed(3)
    first = crop(dict(img=img))['img']
    np.random.seed(3)
    again = crop(dict(img=img))['img']
    assert first.shape == (8, 12, 3)
    np.testing.assert_array_equal(first, again)
    small = RandomImageCrop(crop_size=16, pad_val=7)(dict(img=img[:4, :5]))
    assert small['img'].shape == (16, 16, 3)
    assert small['img_shape'] == (16, 16)
    assert (small['img'][4:] == 7).all()


def test_random_crop_rejects_bad_size():
    with pytest.raises(ValueError, match='crop_size'):
        RandomImageCrop(crop_size=(0, 3))


def test_pack_makes_chw_tensor_and_label_sample():
    img = np.random.randint(0, 255, (5, 6, 3), dtype=np.uint8)
    packed = PackImageLabelInputs()(
        dict(img=img, gt_label=4, img_path='a.jpg', sample_idx=2))
    assert packed['inputs'].shape == (3, 5, 6)
    assert torch.equal(packed['inputs'][0], torch.from_numpy(img[..., 0]))
    assert packed['data_samples'].gt_label.tolist() == [4]
    assert packed['data_samples'].img_path == 'a.jpg'
    gray = PackImageLabelInputs()(dict(img=img[..., 0], gt_label=0))
    assert gray['inputs'].shape == (1, 5, 6)
