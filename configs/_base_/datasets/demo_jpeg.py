# The demo set written by tools/make_demo_data.py. Override its location
# with the MMDATA_DEMO_ROOT environment variable (mmengine substitutes it).
data_root = '{{$MMDATA_DEMO_ROOT:data/demo}}'
crop_size = 64

metainfo = dict(classes=('circle', 'square', 'triangle', 'ring', 'cross',
                         'diamond', 'horizontal bar', 'vertical bar'))

# The pipelines are mmcv's usual ones, wrapped in ReducedDecodePipeline: it
# swaps LoadImageFromFile for LoadImageFromFileReduced, which decodes each
# JPEG at the smallest DCT scale (1/2, 1/4, 1/8) still at least as large as
# the largest output of the resize after it (here RandomResize's scale times
# the top of its ratio_range), so the 720p/1080p frames are decoded at 1/8,
# not in full. Output shapes and scale factors are those of the unwrapped
# pipeline (docs/reduced_decoding.md). Change the resize freely: the decode
# size follows it.
train_pipeline = [
    dict(
        type='ReducedDecodePipeline',
        transforms=[
            dict(type='LoadImageFromFile'),
            # Short side to ~72 px (mmcv's idiom: a huge long-side bound),
            # jittered.
            dict(
                type='RandomResize',
                scale=(72, 4096),
                ratio_range=(0.9, 1.2),
                keep_ratio=True),
            dict(type='RandomImageCrop', crop_size=crop_size),
            dict(type='RandomFlip', prob=0.5, direction='horizontal'),
            dict(type='PackImageLabelInputs'),
        ])
]

val_pipeline = [
    dict(
        type='ReducedDecodePipeline',
        transforms=[
            dict(type='LoadImageFromFile'),
            dict(type='Resize', scale=(72, 4096), keep_ratio=True),
            dict(type='CenterCrop', crop_size=crop_size),
            dict(type='PackImageLabelInputs'),
        ])
]

# RankShardedDataset reads the list in place (a byte-offset index built once
# next to it): no rank or worker holds a copy. Its samplers split the ranks;
# the infinite one serves iteration-based training.
train_dataloader = dict(
    batch_size=16,
    num_workers=2,
    persistent_workers=True,
    sampler=dict(type='RankShardedInfiniteSampler', shuffle=True),
    dataset=dict(
        type='RankShardedDataset',
        data_root=data_root,
        ann_file='train.txt',
        metainfo=metainfo,
        pipeline=train_pipeline),
)

val_dataloader = dict(
    batch_size=32,
    num_workers=2,
    persistent_workers=True,
    # shuffle=False: the plain order, so every sample is evaluated once.
    sampler=dict(type='RankShardedSampler', shuffle=False),
    dataset=dict(
        type='RankShardedDataset',
        data_root=data_root,
        ann_file='val.txt',
        metainfo=metainfo,
        test_mode=True,
        pipeline=val_pipeline),
)
val_evaluator = dict(type='SingleLabelAccuracy')
