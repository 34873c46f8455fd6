# The demo, reading its data from an HTTP(S) object store instead of the
# local disk: the one added block below. tools/run_demo.py-style local data
# can be served for a try with
#   python -m mmdata_plugin.testing.loopback_http data/demo --latency 0.02
# and MMDATA_REMOTE_ROOT set to the URL it prints. For S3 (AWS, MinIO,
# Ceph) use an s3://bucket/prefix/ root and the backend_args in README.md.
_base_ = ['./tinycnn_demo-jpeg.py']

# ---- remote data: the annotation lists are fetched once per node (checked
# by size/ETag); images are read per sample through mmengine's fileio, whose
# http(s):// backend is now ours: pooled keep-alive connections, timeouts,
# retries (docs/remote_data.md).
remote_root = '{{$MMDATA_REMOTE_ROOT:http://127.0.0.1:8000/}}'
train_dataloader = dict(dataset=dict(data_root=remote_root))
val_dataloader = dict(dataset=dict(data_root=remote_root))
