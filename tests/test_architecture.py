"""The layers of docs/architecture.md, checked on the imports of every module.

Run as a script to print the imports that cross packages:
``python tests/test_architecture.py``.
"""
import ast
import os.path as osp
import pathlib
import sys
from typing import Dict, Iterator, List, NamedTuple, Sequence, Tuple

import pytest

try:
    from helpers import REPO_ROOT
except ImportError:  # run as a script from elsewhere
    REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))

PACKAGE = 'mmdata_plugin'

#: Bottom first. A package may import packages of lower layers only; the
#: package's own ``__init__`` (the top) may import all of them.
LAYERS: Tuple[Tuple[str, ...], ...] = (
    ('utils', 'version', 'supported_stack'),
    ('testing', 'sample_order', 'cache'),
    ('remote', ),
    ('transforms', 'remote_cache', 'handover'),
    ('datasets', 'models', 'evaluation', 'data_nodes'),
    ('data_monitor', ),
    ('engine', ),
)


class Import(NamedTuple):
    """One import statement's target, as a module of the package."""
    file: str  # relative to the repository root
    line: int
    source: str  # importing module, dotted
    target: str  # imported module (or package), dotted


def _module_name(root: pathlib.Path, path: pathlib.Path) -> str:
    parts = list(path.relative_to(root).with_suffix('').parts)
    if parts[-1] == '__init__':
        parts.pop()
    return '.'.join(parts)


def _targets(node: ast.AST, module: str, is_package: bool,
             modules: set) -> Iterator[str]:
    """Modules of ``modules`` that an import statement loads by name."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name
        return
    if not isinstance(node, ast.ImportFrom):
        return
    if node.level:
        base = module.split('.')
        # `from .` inside a package's __init__ is the package itself.
        drop = node.level - 1 if is_package else node.level
        if drop >= len(base):
            raise ValueError(f'{module}: relative import beyond the package')
        base = base[:len(base) - drop]
        stem = '.'.join(base + ([node.module] if node.module else []))
    else:
        stem = node.module
    for alias in node.names:
        # `from pkg import name` loads the module pkg.name when it is one.
        submodule = f'{stem}.{alias.name}'
        yield submodule if submodule in modules else stem


def scan_imports(root: str, package: str = PACKAGE) -> List[Import]:
    """Every import of ``package`` (a folder under ``root``) that targets
    a module of the same package: top-level ones and those inside
    functions, relative ones resolved."""
    root_path = pathlib.Path(root)
    files = sorted((root_path / package).rglob('*.py'))
    modules = {_module_name(root_path, path) for path in files}
    found = []
    for path in files:
        module = _module_name(root_path, path)
        tree = ast.parse(path.read_text(encoding='utf-8'), str(path))
        for node in ast.walk(tree):
            for target in _targets(node, module,
                                   path.name == '__init__.py', modules):
                if target == package or target.startswith(package + '.'):
                    found.append(
                        Import(
                            str(path.relative_to(root_path)), node.lineno,
                            module, target))
    # `from .x import a, b` names module .x once, not once per name.
    return list(dict.fromkeys(found))


def top_package(module: str) -> str:
    """``a.b.c`` -> ``b``: the package of the layer table (``''`` for the
    package's own ``__init__``)."""
    parts = module.split('.')
    return parts[1] if len(parts) > 1 else ''


def layer_of(package: str, layers: Sequence[Tuple[str, ...]]) -> int:
    if package == '':
        return len(layers)
    for number, names in enumerate(layers):
        if package in names:
            return number
    raise KeyError(package)


def cross_package_imports(imports: Sequence[Import]) -> List[Import]:
    return [
        found for found in imports
        if top_package(found.source) != top_package(found.target)
    ]


def layer_violations(imports: Sequence[Import],
                     layers: Sequence[Tuple[str, ...]]) -> List[str]:
    """Messages for imports that do not go down the layers."""
    problems = []
    for found in cross_package_imports(imports):
        source, target = top_package(found.source), top_package(found.target)
        try:
            down = layer_of(target, layers) < layer_of(source, layers)
        except KeyError as error:
            problems.append(
                f'{found.file}:{found.line}: package {error.args[0]!r} is '
                'in no layer of tests/test_architecture.py LAYERS (and '
                'docs/architecture.md): place it there')
            continue
        if not down:
            problems.append(
                f'{found.file}:{found.line} imports {found.target}: '
                f'{source} (layer {layer_of(source, layers)}) may only '
                f'import lower layers, {target} is layer '
                f'{layer_of(target, layers)}')
    return problems


def import_cycles(imports: Sequence[Import]) -> List[List[str]]:
    """Groups of modules that import each other (directly or not),
    found with Tarjan's strongly connected components."""
    graph: Dict[str, List[str]] = {}
    for found in imports:
        graph.setdefault(found.source, []).append(found.target)
        graph.setdefault(found.target, [])
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack = set()
    cycles = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in graph[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1 or module in graph[module]:
                cycles.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return cycles


def _cycle_messages(imports: Sequence[Import]) -> List[str]:
    messages = []
    for group in import_cycles(imports):
        members = set(group)
        edges = [
            f'  {found.file}:{found.line} imports {found.target}'
            for found in imports
            if found.source in members and found.target in members
        ]
        messages.append(f'import cycle among {group}:\n' + '\n'.join(edges))
    return messages


def test_every_import_goes_down_the_layers():
    problems = layer_violations(scan_imports(REPO_ROOT), LAYERS)
    assert not problems, '\n'.join(problems)


def test_no_module_imports_itself_back():
    problems = _cycle_messages(scan_imports(REPO_ROOT))
    assert not problems, '\n'.join(problems)


def test_every_package_has_a_layer():
    packages = {
        top_package(_module_name(pathlib.Path(REPO_ROOT), path))
        for path in pathlib.Path(REPO_ROOT, PACKAGE).glob('*')
        if path.suffix == '.py' or (path / '__init__.py').exists()
    }
    packages.discard('')
    placed = {name for names in LAYERS for name in names}
    assert packages == placed


def _write(root: pathlib.Path, files: Dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


TOY_LAYERS = (('low', ), ('high', ))


@pytest.mark.parametrize('statement', [
    'from ..high import top',
    'from ..high.top import thing',
    'from .. import high',
    'import pkg.high.top',
    'def f():\n    from pkg.high import top\n',
])
def test_an_upward_import_is_named_with_its_file(tmp_path, statement):
    _write(
        tmp_path, {
            'pkg/__init__.py': '',
            'pkg/low/__init__.py': '',
            'pkg/low/base.py': f'import os\n{statement}\n',
            'pkg/high/__init__.py': '',
            'pkg/high/top.py': 'from ..low import base\n',
        })
    problems = layer_violations(scan_imports(str(tmp_path), 'pkg'),
                                TOY_LAYERS)
    assert len(problems) == 1
    assert problems[0].startswith(osp.join('pkg', 'low', 'base.py') + ':')
    assert 'low (layer 0) may only import lower layers, high is layer 1' \
        in problems[0]


def test_a_cycle_inside_a_package_is_named(tmp_path):
    _write(
        tmp_path, {
            'pkg/__init__.py': '',
            'pkg/low/__init__.py': '',
            'pkg/low/a.py': 'from . import b\n',
            'pkg/low/b.py': 'def f():\n    from .a import g\n',
            'pkg/high/__init__.py': 'from ..low import a\n',
        })
    imports = scan_imports(str(tmp_path), 'pkg')
    assert not layer_violations(imports, TOY_LAYERS)
    (message, ) = _cycle_messages(imports)
    assert "['pkg.low.a', 'pkg.low.b']" in message
    assert osp.join('pkg', 'low', 'b.py') + ':2 imports pkg.low.a' in message


def test_a_package_without_a_layer_is_refused(tmp_path):
    _write(tmp_path, {
        'pkg/__init__.py': '',
        'pkg/low/a.py': 'from ..new import b\n',
        'pkg/new/b.py': '',
    })
    (problem, ) = layer_violations(scan_imports(str(tmp_path), 'pkg'),
                                   TOY_LAYERS)
    assert "package 'new' is in no layer" in problem


if __name__ == '__main__':
    root = sys.argv[1] if len(sys.argv) > 1 else REPO_ROOT
    for found in cross_package_imports(scan_imports(root)):
        if top_package(found.source):
            print(f'{top_package(found.source):>13} -> '
                  f'{top_package(found.target):<13} {found.file}:'
                  f'{found.line} {found.target}')
