"""Top-1 accuracy for single-label classification."""
from typing import List, Sequence

from mmengine.evaluator import BaseMetric
from mmengine.registry import METRICS


@METRICS.register_module()
class SingleLabelAccuracy(BaseMetric):
    """Percentage of samples whose ``pred_label`` equals ``gt_label``.

    Args:
        collect_device (str): Where results are gathered across ranks,
            ``'cpu'`` or ``'gpu'``. Defaults to ``'cpu'``.
        prefix (str, optional): Metric name prefix; defaults to ``'cls'``.
        collect_dir (str, optional): Folder for gathering results through
            the file system (``collect_device='cpu'`` only), as in
            mmengine's ``BaseMetric``. Defaults to a temporary folder.
    """

    default_prefix = 'cls'

    def process(self, data_batch, data_samples: Sequence[dict]) -> None:
        for sample in data_samples:
            self.results.append(
                int(sample['pred_label'].item() == sample['gt_label'].item()))

    def compute_metrics(self, results: List[int]) -> dict:
        return dict(top1=100.0 * sum(results) / max(len(results), 1))
