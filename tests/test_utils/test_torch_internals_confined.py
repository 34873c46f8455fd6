"""Private torch/mmengine names are used in utils/torch_internals.py only.

Every access of a name torch or mmengine keep private (a leading ``_``) is
a place a new release can break; they all sit in one module so the
compatibility matrix exercises each once. This scans every other module of
the package and fails, naming file and line, on:

* an import from a private module (``torch._weights_only_unpickler``,
  ``torch.utils.data._utils``, ``mmengine.x._y``) or of a private name
  (``from torch.utils.data.dataloader import _BaseDataLoaderIter``);
* ``X._name`` (or ``getattr(X, '_name')``, ``setattr``, ``hasattr``) where
  ``X`` is rooted at an imported torch/mmengine name (``torch._C``,
  ``mmengine_checkpoint._get_mmengine_home``);
* ``self._name`` in a class that extends a torch/mmengine class, where a
  torch/mmengine class of its MRO has ``_name`` (``self._iter`` of a loop),
  or in any class (a mixin) where the package never sets ``_name`` and
  torch or mmengine has it;
* ``X._name`` on any other object where torch (its data, storage, tensor
  and serialization modules, its tensor/storage/loader classes) or mmengine
  has an attribute ``_name``: such a name on an object of ours must be
  renamed, so that ``loader._iterator`` cannot pass for an attribute of
  ours. ``self._name`` in a class of ours alone is ours.

Run as a script to print the findings: ``python <this file>``.
"""
import ast
import functools
import importlib
import inspect
import os.path as osp
import pathlib
import re
import sys
from typing import Dict, Iterator, List, Set, Tuple

import mmengine
import pytest
import torch
from torch.utils.data import DataLoader

try:
    from helpers import REPO_ROOT
except ImportError:  # run as a script from elsewhere
    REPO_ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))

PACKAGE = pathlib.Path(REPO_ROOT) / 'mmdata_plugin'
ALLOWED_FILE = PACKAGE / 'utils' / 'torch_internals.py'
FOREIGN = ('torch', 'mmengine')
_TORCH_ROOT = pathlib.Path(torch.__file__).parent
# The torch sources whose objects the package handles (loaders and their
# iterators, workers, storages, tensors, checkpoints), and the classes whose
# C-level private members no source file shows.
_TORCH_SOURCES = [
    _TORCH_ROOT / 'utils' / 'data', _TORCH_ROOT / 'storage.py',
    _TORCH_ROOT / '_tensor.py', _TORCH_ROOT / 'serialization.py'
]
_TORCH_CLASSES = (torch.Tensor, torch.UntypedStorage, torch.TypedStorage,
                  DataLoader, torch.Generator)
_ACCESSORS = ('getattr', 'setattr', 'hasattr', 'delattr')
_DOTTED = re.compile(r'[A-Za-z_]\w*(\.[A-Za-z_]\w*)+')


def _is_private(name: str) -> bool:
    return name.startswith('_') and not (name.startswith('__')
                                         and name.endswith('__'))


def _is_foreign(module: str) -> bool:
    return (module or '').split('.')[0] in FOREIGN


def _private_module(module: str) -> bool:
    return _is_foreign(module) and any(
        _is_private(part) for part in module.split('.'))


def _python_files(*roots: pathlib.Path) -> Iterator[pathlib.Path]:
    for root in roots:
        if root.is_file():
            yield root
        elif root.is_dir():
            # Not mmdata_plugin/.mim: the copies of tools/ and configs/ an
            # install puts there for `mim train` are no modules of ours.
            yield from sorted(
                path for path in root.rglob('*.py')
                if not any(part.startswith('.')
                           for part in path.relative_to(root).parts))


def _defined_names(tree: ast.AST) -> Set[str]:
    """Private names a source defines: assigned on an object
    (``obj._x = ...``), or a function, class or variable."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node,
                      (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(
                node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return {name for name in names if _is_private(name)}


@functools.lru_cache(maxsize=None)
def _foreign_private_names() -> Set[str]:
    names = set()
    for path in _python_files(*_TORCH_SOURCES,
                              pathlib.Path(mmengine.__file__).parent):
        try:
            names |= _defined_names(ast.parse(path.read_text('utf-8')))
        except (SyntaxError, UnicodeDecodeError):
            continue
    for cls in _TORCH_CLASSES:
        names |= {name for name in dir(cls) if _is_private(name)}
    return names


@functools.lru_cache(maxsize=None)
def _inherited_private_names(cls: type) -> Set[str]:
    """Private attributes of the torch/mmengine classes ``cls`` extends."""
    names = set()
    for base in cls.__mro__:
        if not _is_foreign(base.__module__):
            continue
        names |= {name for name in vars(base) if _is_private(name)}
        try:
            names |= _defined_names(ast.parse(inspect.getsource(base)))
        except (OSError, TypeError):  # defined in C: vars() has it all
            pass
    return names


class _Scan(ast.NodeVisitor):

    def __init__(self, module, ours: Set[str], theirs: Set[str]):
        self.module = module
        self.ours = ours
        self.theirs = theirs
        self.inherited: List[Set[str]] = []
        self.foreign_names: Set[str] = set()
        self.findings: List[Tuple[int, str]] = []

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if _private_module(alias.name):
                self.findings.append((node.lineno, f'import {alias.name}'))
            if _is_foreign(alias.name):
                self.foreign_names.add(alias.asname
                                       or alias.name.split('.')[0])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level or not _is_foreign(node.module):
            return
        for alias in node.names:
            if _private_module(node.module) or _is_private(alias.name):
                self.findings.append(
                    (node.lineno, f'from {node.module} import {alias.name}'))
            self.foreign_names.add(alias.asname or alias.name)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        cls = getattr(self.module, node.name, None)
        self.inherited.append(
            _inherited_private_names(cls) if isinstance(cls, type) else
            set())
        self.generic_visit(node)
        self.inherited.pop()

    def _check(self, line: int, base: ast.AST, name: str) -> None:
        if not _is_private(name):
            return
        root = base
        while isinstance(root, (ast.Attribute, ast.Call, ast.Subscript)):
            root = root.func if isinstance(root, ast.Call) else root.value
        if isinstance(base, ast.Name) and base.id in ('self', 'cls'):
            found = (bool(self.inherited) and name in self.inherited[-1]) or (
                name in self.theirs and name not in self.ours)
        else:
            found = (isinstance(root, ast.Name)
                     and root.id in self.foreign_names) or name in self.theirs
        if found:
            self.findings.append((line, f'{ast.unparse(base)}.{name}'))

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self._check(node.lineno, node.value, node.attr)
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        # A module named in a string (__import__, importlib, a preload list)
        if (isinstance(node.value, str) and _DOTTED.fullmatch(node.value)
                and _private_module(node.value)):
            self.findings.append((node.lineno, repr(node.value)))

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if (isinstance(func, ast.Name) and func.id in _ACCESSORS
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)):
            self._check(node.lineno, node.args[0], node.args[1].value)
        self.generic_visit(node)


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix('').parts)
    if parts[-1] == '__init__':
        parts.pop()
    return '.'.join(parts)


def findings(sources: Dict[pathlib.Path, str] = None) -> List[str]:
    """``file:line: access`` for every private torch/mmengine name outside
    torch_internals.py; ``sources`` replaces the text of some files."""
    texts = {
        path: (sources or {}).get(path) or path.read_text('utf-8')
        for path in _python_files(PACKAGE) if path != ALLOWED_FILE
    }
    trees = {path: ast.parse(text) for path, text in texts.items()}
    ours = set().union(*map(_defined_names, trees.values()))
    theirs = _foreign_private_names()
    found = []
    for path, tree in trees.items():
        scan = _Scan(
            importlib.import_module(_module_name(path)), ours, theirs)
        # Imports first: a name imported inside a function is foreign in
        # the whole module.
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                scan.visit(node)
        scan.findings.clear()
        scan.visit(tree)
        relative = path.relative_to(REPO_ROOT)
        found += [
            f'{relative}:{line}: {what}'
            for line, what in sorted(set(scan.findings))
        ]
    return found


def test_private_torch_and_mmengine_names_only_in_torch_internals():
    assert findings() == []


@pytest.mark.parametrize('added, access', [
    ('def peek(loader):\n    return loader._iterator', 'loader._iterator'),
    ("def peek(it):\n    return getattr(it, '_shutdown_workers')",
     'it._shutdown_workers'),
    ('from torch.utils.data._utils import pin_memory',
     'from torch.utils.data._utils import pin_memory'),
    ('import torch\nREADER = torch._C', 'torch._C'),
    ('def seed(runner):\n    return runner._randomness_cfg',
     'runner._randomness_cfg'),
    ("PRELOAD = ('torch', 'torch._dynamo')", "'torch._dynamo'"),
])
def test_scan_finds_a_private_access_put_back(added, access):
    hook = PACKAGE / 'engine' / 'hooks' / 'device_feed_hook.py'
    source = hook.read_text('utf-8') + '\n\n' + added + '\n'
    found = findings({hook: source})
    assert len(found) == 1 and found[0].endswith(access), found


if __name__ == '__main__':
    sys.exit('\n'.join(findings()) or None)
