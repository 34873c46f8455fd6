optim_wrapper = dict(
    optimizer=dict(type='AdamW', lr=3e-3, weight_decay=0.01))

param_scheduler = [
    dict(type='LinearLR', start_factor=0.04, by_epoch=False, begin=0, end=90),
    dict(type='CosineAnnealingLR', by_epoch=False, begin=90, end=300),
]

# Resumes in O(1), replaying the same samples and augmentations
# (mmdata_plugin, docs/fast_resume.md).
train_cfg = dict(
    type='FastResumeIterBasedTrainLoop', max_iters=300, val_interval=100)
val_cfg = dict(type='ValLoop')
