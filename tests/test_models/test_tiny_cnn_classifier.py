import pytest
import torch
from mmengine.structures import BaseDataElement

from mmdata_plugin.evaluation import SingleLabelAccuracy
from mmdata_plugin.models import TinyCNNClassifier


def _samples(labels):
    samples = []
    for label in labels:
        sample = BaseDataElement()
        sample.gt_label = torch.tensor([label])
        samples.append(sample)
    return samples


def test_modes_and_accuracy_metric():
    model = TinyCNNClassifier(num_classes=3, channels=(4, 8))
    inputs = torch.randn(2, 3, 16, 16)
    assert model(inputs).shape == (2, 3)
    loss = model(inputs, _samples([0, 2]), mode='loss')['loss']
    loss.backward()
    predictions = model(inputs, _samples([0, 2]), mode='predict')
    metric = SingleLabelAccuracy()
    metric.process(None, [p.to_dict() for p in predictions])
    expected = 100.0 * sum(
        int(p.pred_label.item() == p.gt_label.item())
        for p in predictions) / 2
    assert metric.compute_metrics(metric.results) == dict(top1=expected)
    with pytest.raises(ValueError, match='mode'):
        model(inputs, mode='bogus')
