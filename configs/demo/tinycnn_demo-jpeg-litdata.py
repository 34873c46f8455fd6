# The demo, reading its images from LitData chunks instead of one file per
# image: the one changed block below. Pack the demo set first with
#   python tools/make_demo_data.py --litdata-chunks 64
# (data/demo/litdata/{train,val}/index.json + chunk-0-0.bin ...: each sample
# the dict {'image': the JPEG file's bytes, 'label': int}). Chunks written by
# litdata.optimize (no compression, samples opened as JpegImageFile or given
# as bytes) are read the same way; they may be remote:
# data_root='s3://bucket/demo/' (docs/packed_data.md).
_base_ = ['./tinycnn_demo-jpeg.py']

# ---- packed data: LitDataChunkDataset indexes the chunks once and gives
# each sample an img_path `tarmember://...` (the image leaf's bytes in its
# chunk) that mmengine's fileio reads, so the pipeline is unchanged.
litdata_dataset = dict(
    type='LitDataChunkDataset',
    data_root='{{$MMDATA_DEMO_ROOT:data/demo}}',
    image_column='image',
    label_column='label',
    metainfo={{_base_.metainfo}})
train_dataloader = dict(
    dataset=dict(
        litdata_dataset,
        _delete_=True,
        index='litdata/train/index.json',
        pipeline={{_base_.train_pipeline}}))
val_dataloader = dict(
    dataset=dict(
        litdata_dataset,
        _delete_=True,
        index='litdata/val/index.json',
        test_mode=True,
        pipeline={{_base_.val_pipeline}}))
