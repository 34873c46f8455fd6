"""Where data-loading time goes: per stage, transform, worker and rank.

:class:`DataLoaderMonitor` measures a DataLoader (with or without a
Runner); ``DataMonitorHook`` (:mod:`mmdata_plugin.engine.hooks`) drives it
during training. Reports are plain dicts (JSON schema in
docs/data_monitor.md) rendered by :func:`format_report` and
:func:`plot_report`.
"""
from .loader_monitor import (DataLoaderMonitor, loader_context,
                             measure_dataloader)
from .plot import plot_report
from .report import (format_rank_table, format_report, format_stage_table,
                     format_throughput, format_worker_table, load_report,
                     save_report)
from .verdict import build_report, input_bound_level
from .worker_sweep import (format_sweep_table, recommend_workers,
                           summarize_runs)

__all__ = [
    'DataLoaderMonitor', 'loader_context', 'measure_dataloader', 'plot_report',
    'format_rank_table', 'format_report', 'format_stage_table',
    'format_throughput', 'format_worker_table', 'load_report', 'save_report',
    'build_report', 'input_bound_level', 'format_sweep_table',
    'recommend_workers', 'summarize_runs'
]
