# mmpretrain 1.x ResNet-50 on ImageNet. Its meta/train.txt ("path label"
# lines) is read in place by RankShardedDataset; no conversion needed. (A
# CustomDataset that scans class folders: dump it with
# tools/dump_data_list.py and point ann_file at the .jsonl.)
# Train with:  mim train mmpretrain THIS_FILE
_base_ = 'mmpretrain::resnet/resnet50_8xb32_in1k.py'
custom_imports = dict(imports=['mmdata_plugin'], allow_failed_imports=False)

# mmpretrain's schedule says `by_epoch=True`, which mmengine refuses next to
# a loop `type`: replace it, restating the schedule's epochs.
train_cfg = dict(
    _delete_=True,
    type='FastResumeEpochBasedTrainLoop',
    max_epochs=100,
    val_interval=1)

# Each batch crosses from the workers as one shared-memory block, pinned
# once and copied to the GPU one step ahead by DeviceFeedHook
# (docs/handover.md).
train_dataloader = dict(
    pin_memory=True,
    collate_fn=dict(type='block_collate'),
    sampler=dict(type='RankShardedSampler', shuffle=True),
    dataset=dict(
        _delete_=True,
        type='RankShardedDataset',
        data_root='data/imagenet',
        ann_file='meta/train.txt',
        data_prefix=dict(img_path='train'),
        pipeline={{_base_.train_pipeline}}))

custom_hooks = [
    dict(type='DataMonitorHook', interval=50),
    dict(type='DeviceFeedHook'),
]
