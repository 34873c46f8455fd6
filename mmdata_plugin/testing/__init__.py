from .call_count import count_calls
from .distributed import (ProcessFailed, cpu_env, find_free_port, python_path,
                          run_command, run_torchrun, spawn_gloo,
                          torchrun_command)
from .interrupt import (kill_after_checkpoint, last_checkpoint,
                        run_until_checkpoint_then_kill)
from .loopback_http import FaultPlan, LoopbackHTTPServer, ServerStats
from .memory import descendants, process_memory, total_memory
from .loopback_proxy import LoopbackProxy
from .moto_s3 import MotoS3Server
from .warm_python import run_ranks, run_script, start_script

__all__ = [
    'count_calls', 'ProcessFailed', 'cpu_env', 'find_free_port', 'python_path',
    'run_command', 'run_torchrun', 'spawn_gloo', 'torchrun_command',
    'kill_after_checkpoint', 'last_checkpoint',
    'run_until_checkpoint_then_kill', 'descendants',
    'process_memory', 'total_memory', 'FaultPlan', 'LoopbackHTTPServer',
    'ServerStats', 'LoopbackProxy', 'MotoS3Server', 'run_ranks', 'run_script',
    'start_script'
]
