"""The README, docs/ and docstrings say what the code does."""
import inspect
import os.path as osp
import re

import pytest
from mmengine.registry import (DATA_SAMPLERS, DATASETS, HOOKS, LOOPS,
                               METRICS, MODELS, OPTIM_WRAPPERS, TRANSFORMS)

import mmdata_plugin  # noqa: F401
from helpers import REPO_ROOT


def _read(*parts):
    with open(osp.join(REPO_ROOT, *parts), encoding='utf-8') as f:
        return f.read()


def test_readme_synopsis_of_train_py_names_every_option():
    options = set(
        re.findall(r"add_argument\(\s*'(--[\w-]+)'", _read('tools',
                                                             'train.py')))
    options.discard('--local_rank')  # set by launchers, not by users
    readme = _read('README.md')
    start = readme.index('python tools/train.py CONFIG')
    synopsis = readme[start:readme.index('```', start)]
    missing = sorted(o for o in options if o not in synopsis)
    assert not missing, f'README synopsis of tools/train.py lacks {missing}'


def test_index_build_rate_is_the_same_everywhere():
    # The figures of the latest benchmark run (README), not an older one.
    readme = re.findall(r'index build (\d+) MB/s', _read('README.md'))
    docs = _read('docs', 'rank_sharded_dataset.md')
    measured = re.findall(r'measured (\d+) MB/s', docs) + re.findall(
        r'Index build: .*= (\d+) MB/s', docs)
    assert readme and measured
    assert set(measured) == set(readme), (readme, measured)


def _registered_classes():
    for registry in (DATA_SAMPLERS, DATASETS, HOOKS, LOOPS, METRICS, MODELS,
                     OPTIM_WRAPPERS, TRANSFORMS):
        for name, cls in sorted(registry.module_dict.items()):
            if inspect.isclass(cls) and cls.__module__.startswith(
                    'mmdata_plugin.'):
                yield pytest.param(cls, id=name)


@pytest.mark.parametrize('cls', list(_registered_classes()))
def test_registered_classes_document_their_arguments(cls):
    doc = inspect.getdoc(cls) or ''
    init = cls.__init__
    params = [
        p.name for p in inspect.signature(init).parameters.values()
        if p.name != 'self' and p.kind not in (p.VAR_POSITIONAL,
                                               p.VAR_KEYWORD)
    ]
    if not params:
        return
    assert 'Args:' in doc, f'{cls.__name__} has no Args: section'
    args = doc[doc.index('Args:'):]
    if re.search(r'^\s+\*\*kwargs\b', args, re.M) and not \
            init.__module__.startswith('mmdata_plugin.'):
        params = []  # an mmengine base's arguments, passed on as **kwargs
    missing = [p for p in params if not re.search(rf'^\s+{p}\b', args, re.M)]
    assert not missing, f'{cls.__name__} Args: lacks {missing}'
