from .distributed import (ProcessFailed, cpu_env, find_free_port, run_command,
                          run_torchrun, spawn_gloo, torchrun_command)
from .interrupt import last_checkpoint, run_until_checkpoint_then_kill
from .memory import descendants, process_memory, total_memory

__all__ = [
    'ProcessFailed', 'cpu_env', 'find_free_port', 'run_command',
    'run_torchrun', 'spawn_gloo', 'torchrun_command', 'last_checkpoint',
    'run_until_checkpoint_then_kill', 'descendants', 'process_memory',
    'total_memory'
]
