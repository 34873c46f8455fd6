# mmdet 3.x Mask R-CNN on COCO, its annotations read by RankShardedDataset
# and its data stream resumable mid-epoch. Make the .jsonl once (it applies
# the config's filter_cfg and prints the dataset block below):
#   python tools/dump_data_list.py \
#       mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py \
#       data/coco/annotations/instances_train2017.jsonl --check 64
# then train with mmdet's script:  mim train mmdet THIS_FILE
# Needs mmdet 3.x with the full mmcv (compiled ops); see docs/downstream.md.
_base_ = 'mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py'
custom_imports = dict(imports=['mmdata_plugin'], allow_failed_imports=False)

# Resumable at any iteration (CheckpointHook(by_epoch=False) for
# mid-epoch checkpoints); the other arguments are EpochBasedTrainLoop's.
train_cfg = dict(type='FastResumeEpochBasedTrainLoop')

# The batch sampler (mmdet's AspectRatioBatchSampler) is inherited: under
# the fast-resume loop its batches of the current epoch are replayed on
# indices (annotation reads only, no image) and resume exactly.
# Each batch crosses from the workers as one shared-memory block, pinned
# once and copied to the GPU one step ahead by DeviceFeedHook
# (docs/handover.md).
train_dataloader = dict(
    pin_memory=True,
    collate_fn=dict(type='block_collate'),
    sampler=dict(type='RankShardedSampler', shuffle=True),
    dataset=dict(
        _delete_=True,  # CocoDataset's filter_cfg/backend_args do not apply
        type='RankShardedDataset',
        data_root='data/coco/',
        ann_file='annotations/instances_train2017.jsonl',
        data_prefix=dict(img_path='train2017/'),
        pipeline={{_base_.train_pipeline}}))

custom_hooks = [
    dict(type='DataMonitorHook', interval=50),
    dict(type='DeviceFeedHook'),
]
