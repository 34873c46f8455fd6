# The demo, reading its images from MosaicML Streaming MDS shards instead of
# one file per image: the one changed block below. Pack the demo set first
# with
#   python tools/make_demo_data.py --mds-shards 64
# (data/demo/mds/{train,val}/index.json + shard.00000.mds ...: columns
# `image` (the JPEG file's bytes) and `label`). Shards written by Streaming's
# MDSWriter (compression=None) are read the same way; they may be remote:
# data_root='s3://bucket/demo/' (docs/packed_data.md).
_base_ = ['./tinycnn_demo-jpeg.py']

# ---- packed data: MDSShardDataset indexes the shards once and gives each
# sample an img_path `tarmember://...` (the image column's bytes in its
# shard) that mmengine's fileio reads, so the pipeline is unchanged.
mds_dataset = dict(
    type='MDSShardDataset',
    data_root='{{$MMDATA_DEMO_ROOT:data/demo}}',
    image_column='image',
    label_column='label',
    metainfo={{_base_.metainfo}})
train_dataloader = dict(
    dataset=dict(
        mds_dataset,
        _delete_=True,
        index='mds/train/index.json',
        pipeline={{_base_.train_pipeline}}))
val_dataloader = dict(
    dataset=dict(
        mds_dataset,
        _delete_=True,
        index='mds/val/index.json',
        test_mode=True,
        pipeline={{_base_.val_pipeline}}))
