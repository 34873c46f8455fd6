from .cpu_autocast_optim_wrapper import CPUAutocastOptimWrapper

__all__ = ['CPUAutocastOptimWrapper']
