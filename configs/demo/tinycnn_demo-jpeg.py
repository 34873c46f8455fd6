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
