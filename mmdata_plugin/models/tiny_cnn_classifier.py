"""A small CNN image classifier that trains in seconds on a CPU."""
from typing import List, Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.model import BaseModel
from mmengine.registry import MODELS
from mmengine.structures import BaseDataElement


@MODELS.register_module()
class TinyCNNClassifier(BaseModel):
    """Conv-BN-ReLU-pool stages, a pooled feature grid and a linear head.

    It exists so that the demo exercises the data side of a real training
    (backward pass, optimizer, checkpoints, validation) on any machine.

    Args:
        num_classes (int): Number of classes.
        channels (Sequence[int]): Output channels of each stage.
        pooled_size (int): Side of the feature grid fed to the head.
        data_preprocessor (dict, optional): Usually an
            ``ImgDataPreprocessor`` that stacks and normalises the images.
        init_cfg (dict, optional): mmengine weight initialisation config.
    """

    def __init__(self,
                 num_classes: int,
                 channels: Sequence[int] = (16, 32, 64),
                 pooled_size: int = 4,
                 data_preprocessor: Optional[dict] = None,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(
            data_preprocessor=data_preprocessor, init_cfg=init_cfg)
        stages, in_channels = [], 3
        for out_channels in channels:
            stages += [
                nn.Conv2d(in_channels, out_channels, 3, padding=1,
                          bias=False),
                nn.BatchNorm2d(out_channels),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(2),
            ]
            in_channels = out_channels
        # A small pooled grid rather than a global average keeps where
        # things are, which is what tells the demo's shapes apart.
        self.features = nn.Sequential(*stages,
                                      nn.AdaptiveAvgPool2d(pooled_size),
                                      nn.Flatten())
        self.head = nn.Linear(in_channels * pooled_size**2, num_classes)

    def forward(self,
                inputs: torch.Tensor,
                data_samples: Optional[List[BaseDataElement]] = None,
                mode: str = 'tensor'):
        logits = self.head(self.features(inputs))
        if mode == 'tensor':
            return logits
        if mode == 'loss':
            labels = torch.cat([s.gt_label for s in data_samples])
            return dict(loss=F.cross_entropy(logits, labels))
        if mode == 'predict':
            for sample, score in zip(data_samples, logits.softmax(dim=1)):
                sample.pred_score = score
                sample.pred_label = score.argmax().view(1)
            return data_samples
        raise ValueError(
            f'mode must be "tensor", "loss" or "predict", got {mode!r}')
