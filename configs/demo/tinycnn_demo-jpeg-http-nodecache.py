# The HTTP demo with a node cache that follows the known sample order: the
# one added block below. Each node keeps at most cache_limit bytes of the
# remote data in cache_dir, downloads its next samples ahead and keeps the
# ones read again soonest (docs/remote_cache.md). Run it like the HTTP demo:
#   python -m mmdata_plugin.testing.loopback_http data/demo --latency 0.05
#   MMDATA_REMOTE_ROOT=<printed URL> python tools/train.py \
#       configs/demo/tinycnn_demo-jpeg-http-nodecache.py
_base_ = ['./tinycnn_demo-jpeg-http.py']

# ---- node cache: the train pipeline's loading transforms read through it.
custom_hooks = [
    dict(type='DataMonitorHook', interval=10, table_interval=100),
    dict(type='DeviceFeedHook'),
    dict(
        type='RemoteCachePrefetchHook',
        cache_dir='{{$MMDATA_NODE_CACHE:/tmp/mmdata_node_cache}}',
        cache_limit='{{$MMDATA_NODE_CACHE_LIMIT:200MB}}'),
]
