# The demo set written by tools/make_demo_data.py. Override its location
# with the MMDATA_DEMO_ROOT environment variable (mmengine substitutes it).
data_root = '{{$MMDATA_DEMO_ROOT:data/demo}}'
crop_size = 64

metainfo = dict(classes=('circle', 'square', 'triangle', 'ring', 'cross',
                         'diamond', 'horizontal bar', 'vertical bar'))

# The train pipeline's deterministic head -- load, decode, resize to just
# above the largest size RandomResize can draw -- runs once per image: its
# output is kept in the node's cache (CachedPipelineHead; docs/head_cache.md)
# and later epochs, ranks and runs read it back. storage='raw' is lossless,
# so a run gives the same batches with a cold or a warm cache. The cache
# lives in $MMDATA_CACHE_DIR (default ~/.cache/mmdata_plugin), never in the
# repository; it is shared by the node's jobs within cache_limit.
# Inside it, ReducedDecodePipeline decodes each JPEG at the smallest DCT
# scale (1/2, 1/4, 1/8) still at least as large as the resize's output, so
# the 720p/1080p frames are decoded at 1/8, not in full
# (docs/reduced_decoding.md): the first epoch is fast too.
train_pipeline = [
    dict(
        type='CachedPipelineHead',
        cache_limit='2GB',
        storage='raw',
        transforms=[
            dict(
                type='ReducedDecodePipeline',
                transforms=[
                    dict(type='LoadImageFromFile'),
                    # 87 = ceil(72 * 1.2), RandomResize's largest short side
                    dict(type='Resize', scale=(87, 4096), keep_ratio=True),
                ])
        ]),
    # Short side to ~72 px (mmcv's idiom: a huge long-side bound), jittered.
    dict(
        type='RandomResize',
        scale=(72, 4096),
        ratio_range=(0.9, 1.2),
        keep_ratio=True),
    dict(type='RandomImageCrop', crop_size=crop_size),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='PackImageLabelInputs'),
]

# Validation decodes reduced too (see above); it runs once per evaluation.
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
    # One shared-memory block per batch (all its tensors, images stacked);
    # DeviceFeedHook in the config unpacks it (docs/handover.md). On a GPU
    # add pin_memory=True: the block is then pinned with one copy.
    collate_fn=dict(type='block_collate'),
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
