# The LitData-chunk demo with its chunks on an HTTP(S) object store and read
# through the node cache, in the shard-aware order: the changed blocks
# below. Each sample's image is a byte range of a chunk (a `tarmember://`
# path); the node cache downloads it ahead, neighbours in one range GET,
# and keeps what is read again soonest within cache_limit. Serve the packed
# demo (python tools/make_demo_data.py --litdata-chunks 64) with
#   python -m mmdata_plugin.testing.serve_loopback data/demo --latency 0.02
# and set MMDATA_REMOTE_ROOT to the URL it prints.
_base_ = ['./tinycnn_demo-jpeg-litdata.py']

# ---- remote chunks: index.json names the chunks beside it.
remote_root = '{{$MMDATA_REMOTE_ROOT:http://127.0.0.1:8000/}}'
train_dataloader = dict(
    sampler=dict(type='ShardWindowSampler', window_shards=2, _delete_=True),
    dataset=dict(data_root=remote_root))
val_dataloader = dict(dataset=dict(data_root=remote_root))

# ---- node cache (as configs/demo/tinycnn_demo-jpeg-http-nodecache.py).
custom_hooks = [
    dict(type='DataMonitorHook', interval=10, table_interval=100),
    dict(type='DeviceFeedHook'),
    dict(
        type='RemoteCachePrefetchHook',
        cache_dir='{{$MMDATA_NODE_CACHE:/tmp/mmdata_node_cache}}',
        cache_limit='{{$MMDATA_NODE_CACHE_LIMIT:200MB}}'),
]
