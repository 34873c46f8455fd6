from .tiny_cnn_classifier import TinyCNNClassifier

__all__ = ['TinyCNNClassifier']
