# The showcase of mmdata_plugin: a small CNN trained on real JPEGs of mixed
# sizes, on CPU or GPU. Run it with tools/run_demo.py (data generation, an
# interrupted run and its resume) or directly:
#   python tools/train.py configs/demo/tinycnn_demo-jpeg.py
_base_ = [
    '../_base_/models/tiny_cnn.py',
    '../_base_/datasets/demo_jpeg.py',
    '../_base_/schedules/adamw_300it.py',
    '../_base_/default_runtime.py',
]

# Where the data time goes, per stage, transform and worker, with a verdict
# (mmdata_plugin.engine.DataMonitorHook; docs/data_monitor.md). Turn it off
# without editing this file: MMDATA_MONITOR=0.
# DeviceFeedHook moves each batch to the model's device one step ahead (on a
# side stream on a GPU) and hands the data preprocessor views of one block:
# with block_collate below, a batch crosses from the workers as ONE
# shared-memory block instead of a segment per tensor (docs/handover.md).
custom_hooks = [
    dict(type='DataMonitorHook', interval=10, table_interval=100),
    dict(type='DeviceFeedHook'),
]
