model = dict(
    type='TinyCNNClassifier',
    num_classes=8,
    channels=(16, 32, 64, 64),
    pooled_size=2,
    data_preprocessor=dict(
        type='ImgDataPreprocessor',
        mean=[127.5, 127.5, 127.5],
        std=[64.0, 64.0, 64.0],
        bgr_to_rgb=True),
)
