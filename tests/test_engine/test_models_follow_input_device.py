"""The models the tests train create their tensors where their inputs are.

mmengine moves a batch to the GPU whenever there is one, so a model that
makes a tensor on the CPU next to its inputs fails only on CUDA machines.
The ``meta`` device shows the same mistake on any machine: a CPU tensor
combined with a meta one raises.
"""
import torch
from downstream_toys import ToyBoxCounter
from fast_resume_toys import ToyModel
from mmengine.structures import BaseDataElement, InstanceData
from monitor_helpers import SleepyModel

from mmdata_plugin.models import TinyCNNClassifier

META = torch.device('meta')


def _on_meta(*shape):
    return torch.zeros(*shape, device=META)


def test_fast_resume_toy_draws_its_noise_on_the_input_device():
    model = ToyModel().to(META)
    loss = model([_on_meta(3) for _ in range(4)], range(4), mode='loss')
    assert loss['loss'].device == META
    assert model.last_noise.device == META


def test_box_counter_targets_follow_the_input_device():
    samples = [
        BaseDataElement(gt_instances=InstanceData(bboxes=_on_meta(n, 4)))
        for n in (1, 3)
    ]
    loss = ToyBoxCounter().to(META)(
        _on_meta(2, 3, 8, 8), samples, mode='loss')
    assert loss['loss'].device == META


def test_sleepy_model_loss_follows_the_input_device():
    loss = SleepyModel().to(META)([_on_meta(3, 4, 4)] * 2, mode='loss')
    assert loss['loss'].device == META


def test_tiny_cnn_classifier_follows_the_input_device():
    model = TinyCNNClassifier(num_classes=3, channels=(4, 8)).to(META)
    samples = [
        BaseDataElement(gt_label=torch.tensor([label], device=META))
        for label in (0, 2)
    ]
    inputs = _on_meta(2, 3, 16, 16)
    assert model(inputs, samples, mode='loss')['loss'].device == META
    predicted = model(inputs, samples, mode='predict')
    assert {p.pred_label.device for p in predicted} == {META}
