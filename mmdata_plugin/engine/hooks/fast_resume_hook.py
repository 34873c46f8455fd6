"""Carry the train loop's data position through checkpoints."""
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class FastResumeHook(Hook):
    """Saves and reads ``meta['data_position']`` for the fast-resume loops.

    ``FastResumeIterBasedTrainLoop`` and ``FastResumeEpochBasedTrainLoop``
    register one themselves (or bind to the one listed in ``custom_hooks``);
    with any other train loop it does nothing. The saved position is plain
    data (ints, strs, bools), so checkpoints stay loadable with
    ``weights_only=True``.
    """

    priority = 'VERY_HIGH'

    def __init__(self) -> None:
        self.loop = None

    def bind(self, loop) -> None:
        """Serve ``loop`` (a fast-resume train loop)."""
        self.loop = loop

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        # mmengine saves on rank 0 only; the position is the same on all.
        if self.loop is not None:
            checkpoint.setdefault('meta', {})['data_position'] = \
                self.loop.data_position()

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        if self.loop is not None:
            self.loop.load_checkpoint_meta(checkpoint.get('meta', {}))
