# The demo, reading its images from WebDataset tar shards instead of one file
# per image: the one changed block below. Pack the demo set first with
#   python tools/make_demo_data.py --tar-shards 64
# (data/demo/tar/train-000000.tar ...: <key>.jpg + <key>.cls per sample).
# Shards may be remote too: data_root='s3://bucket/demo/' and
# shards='train-{000000..000007}.tar' (docs/packed_data.md).
_base_ = ['./tinycnn_demo-jpeg.py']

# ---- packed data: TarShardDataset indexes the shards once (next to them)
# and gives each sample an img_path `tarmember://...` that mmengine's fileio
# reads as exactly that member's bytes, so the pipeline is unchanged.
tar_dataset = dict(
    type='TarShardDataset',
    data_root='{{$MMDATA_DEMO_ROOT:data/demo}}',
    image_ext='jpg',
    ann_ext='cls',
    metainfo={{_base_.metainfo}})
train_dataloader = dict(
    dataset=dict(
        tar_dataset,
        _delete_=True,
        shards='tar/train-*.tar',
        pipeline={{_base_.train_pipeline}}))
val_dataloader = dict(
    dataset=dict(
        tar_dataset,
        _delete_=True,
        shards='tar/val-*.tar',
        test_mode=True,
        pipeline={{_base_.val_pipeline}}))
