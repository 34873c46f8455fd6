# mmseg 1.x UPerNet on ADE20K (iteration-based), its folder-scanned samples
# read by RankShardedDataset. Make the .jsonl once:
#   python tools/dump_data_list.py \
#       mmseg::upernet/upernet_r50_4xb4-160k_ade20k-512x512.py \
#       data/ade/ADEChallengeData2016/train.jsonl --check 64
# then:  mim train mmsegmentation THIS_FILE
# Needs mmsegmentation 1.x with the full mmcv (compiled ops).
_base_ = 'mmseg::upernet/upernet_r50_4xb4-160k_ade20k-512x512.py'
custom_imports = dict(imports=['mmdata_plugin'], allow_failed_imports=False)

train_cfg = dict(type='FastResumeIterBasedTrainLoop')

# Each batch crosses from the workers as one shared-memory block, pinned
# once and copied to the GPU one step ahead by DeviceFeedHook
# (docs/handover.md).
train_dataloader = dict(
    pin_memory=True,
    collate_fn=dict(type='block_collate'),
    sampler=dict(type='RankShardedInfiniteSampler', shuffle=True),
    dataset=dict(
        _delete_=True,
        type='RankShardedDataset',
        data_root='data/ade/ADEChallengeData2016',
        ann_file='train.jsonl',
        data_prefix=dict(
            img_path='images/training',
            seg_map_path='annotations/training'),
        pipeline={{_base_.train_pipeline}}))

custom_hooks = [
    dict(type='DataMonitorHook', interval=50),
    dict(type='DeviceFeedHook'),
]
