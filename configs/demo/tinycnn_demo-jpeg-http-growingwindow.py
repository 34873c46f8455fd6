# The node-cache demo training on a growing window of the remote data
# (docs/growing_window.md): epoch 0 trains on the first 128 images of a
# seeded arrival order, each later epoch on 64 more, up to 256, then the
# window slides. While an epoch trains, the node prefetcher downloads the
# images entering the next epoch's window, so no epoch after the first
# waits on the remote (docs/remote_cache.md). Run it like the node-cache
# demo:
#   python -m mmdata_plugin.testing.loopback_http data/demo --latency 0.05
#   MMDATA_REMOTE_ROOT=<printed URL> python tools/train.py \
#       configs/demo/tinycnn_demo-jpeg-http-growingwindow.py
_base_ = ['./tinycnn_demo-jpeg-http-nodecache.py']

# ---- growing window: the sampler and an epoch-based loop (epochs differ
# in length; the fast-resume loop resumes them exactly).
train_dataloader = dict(
    sampler=dict(
        _delete_=True,
        type='GrowingWindowSampler',
        initial=128,   # images trained on in epoch 0
        growth=64,     # images the remote delivers while an epoch trains
        capacity=256,  # images the window holds (or cache_limit= and
        # sample_bytes=: capacity = cache_limit // sample_bytes - growth)
        shuffle=True))
train_cfg = dict(
    _delete_=True,
    type='FastResumeEpochBasedTrainLoop',
    max_epochs=6,
    val_interval=6)
