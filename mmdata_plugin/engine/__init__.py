from .optim import CPUAutocastOptimWrapper

__all__ = ['CPUAutocastOptimWrapper']
