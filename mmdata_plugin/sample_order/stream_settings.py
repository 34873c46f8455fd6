"""The settings that define a train dataloader's sample stream.

Besides its seed and the dataset size, a sampler's order depends on some of
its arguments (``shuffle``, ``round_up``, ``mini_epochs`` ...), and the
batches on some of the batch sampler's (``drop_last``). A saved data
position only means something for the same values, so they are saved with
it and compared on resume.

A sampler or batch sampler names its own in a ``stream_defining_attrs``
attribute (a tuple of attribute names whose values are bool, int, float,
str or None); mmengine's and torch's classes, which cannot, are listed here.
"""
from typing import Dict, Optional, Tuple, Union

from mmengine.dataset import DefaultSampler, InfiniteSampler
from torch.utils.data import BatchSampler, DistributedSampler, RandomSampler

Plain = Union[bool, int, float, str, None]

# First match wins; subclasses inherit their base's entry unless they
# declare stream_defining_attrs.
_KNOWN_CLASSES = (
    (DefaultSampler, ('shuffle', 'round_up')),
    (InfiniteSampler, ('shuffle', )),
    (DistributedSampler, ('shuffle', 'drop_last')),
    (RandomSampler, ('replacement', 'num_samples')),
    (BatchSampler, ('drop_last', )),
)


def stream_defining_attrs(obj) -> Tuple[str, ...]:
    """Names of the attributes of ``obj`` that define its stream."""
    declared = getattr(obj, 'stream_defining_attrs', None)
    if declared is not None:
        return tuple(declared)
    for cls, names in _KNOWN_CLASSES:
        if isinstance(obj, cls):
            return names
    return ()


def _settings_of(obj, prefix: str) -> Dict[str, Plain]:
    settings = {}
    for name in stream_defining_attrs(obj):
        value = getattr(obj, name)
        if not isinstance(value, (bool, int, float, str, type(None))):
            raise TypeError(
                f'{type(obj).__name__}.{name} is {value!r} of type '
                f'{type(value).__name__}; attributes named in '
                'stream_defining_attrs must be bool, int, float, str or '
                'None, because checkpoints store them as plain data.')
        settings[prefix + name] = value
    return settings


def dataloader_stream_settings(sampler: Optional[object],
                               batch_sampler) -> Dict[str, Plain]:
    """``{config key under train_dataloader: value}``, plain data.

    Args:
        sampler: The batch sampler's sampler (None if it has none).
        batch_sampler: The DataLoader's (original) batch sampler.
    """
    # mmengine gives torch's BatchSampler the dataloader's own `drop_last`;
    # any other batch sampler is configured under `batch_sampler`.
    batch_prefix = ('' if type(batch_sampler) is BatchSampler else
                    'batch_sampler.')
    settings = _settings_of(batch_sampler, batch_prefix)
    if sampler is not None:
        settings.update(_settings_of(sampler, 'sampler.'))
    return settings
