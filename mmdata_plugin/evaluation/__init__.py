from .accuracy import SingleLabelAccuracy

__all__ = ['SingleLabelAccuracy']
