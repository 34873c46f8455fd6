# Install mmdata_plugin and what it needs into the current Python, changing
# nothing that is there.
#
# Used by the README's two commands (via the Makefile) and by the
# compatibility matrix (tools/compat_matrix.py). It follows the OpenMMLab
# convention (mmdet, mmpretrain): torch, mmengine, mmcv and cv2 come from
# the user's stack; what is missing is installed, what is present is kept:
#
# * torch==2.13.0 only when no torch is importable (an unpinned torch pulls
#   gigabytes of CUDA packages; here pip takes the local CPU build);
# * mmengine (0.10.x) only when no `mmengine` module exists, so OneDL's
#   `onedl-mmengine` (the same module) is never installed over;
# * mmcv-lite only when no `mmcv` module exists, with its requirements
#   except those whose module is present (its `mmengine` requirement names
#   the OpenMMLab distribution, which would go over onedl-mmengine);
# * opencv-python only when no `cv2` module exists.
#
# Every pip call runs under a constraints file pinning the versions of the
# stack's present distributions (torch, numpy, the mm* packages, cv2, the
# CUDA libraries), so pip picks releases that fit them (an opencv-python
# built for numpy 1 under a torch built for numpy 1) instead of upgrading
# them; afterwards those versions are compared, and any change is an error.
#
# `--extras bench` adds LitData and MosaicML Streaming for the benchmark's
# side-by-side: their light imports (requirements/bench.txt) as an extra,
# the two packages with --no-deps (requirements/bench-no-deps.txt), since
# their declared requirements would pull another torch with CUDA,
# torchvision, transformers and cloud SDKs that their readers never import.
#
# The package is installed as a regular (non-editable) install: `mim train`
# looks for tools/ and configs/ in <site-packages>/mmdata_plugin/.mim,
# which an editable install does not have.
import argparse
import importlib
import importlib.metadata
import importlib.util
import os
import os.path as osp
import re
import subprocess
import sys
import tempfile

TORCH_PIN = 'torch==2.13.0'
MMENGINE_REQUIREMENT = 'mmengine>=0.10.3,<0.11'
MMCV_LITE_PIN = 'mmcv-lite==2.2.0'
CV2_DISTRIBUTION = 'opencv-python'
ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
# Extras whose packages are installed without their declared requirements
# (the extra itself names the ones they import): extra -> requirements file.
NO_DEPS_EXTRAS = dict(
    bench=osp.join(ROOT, 'requirements', 'bench-no-deps.txt'))
# Distributions besides those of supported_stack.MODULE_DISTRIBUTIONS
# whose version an install must never change: they are built for one torch.
PINNED_ALSO = ('torchvision', 'torchaudio', 'triton', 'mmdet',
               'onedl-mmdetection', 'mmpretrain', 'onedl-mmpretrain',
               'mmsegmentation', 'onedl-mmsegmentation')


def load_supported_stack():
    """mmdata_plugin/supported_stack.py, without importing the package
    (whose import checks the very stack this script completes)."""
    spec = importlib.util.spec_from_file_location(
        'mmdata_plugin_supported_stack',
        osp.join(ROOT, 'mmdata_plugin', 'supported_stack.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


STACK = load_supported_stack()


def canonical(name: str) -> str:
    return re.sub(r'[-_.]+', '-', name).lower()


def present_distributions() -> dict:
    """``{canonical name: version}`` of this Python's distributions."""
    importlib.invalidate_caches()
    return {
        canonical(dist.metadata['Name']): dist.version
        for dist in importlib.metadata.distributions()
        if dist.metadata['Name']
    }


#: ``{module: canonical names of the distributions that ship it}``.
MODULE_DISTRIBUTIONS = {
    module: {canonical(dist) for dist in dists}
    for module, dists in STACK.MODULE_DISTRIBUTIONS.items()
}


def protected(name: str) -> bool:
    return (any(name in dists for dists in MODULE_DISTRIBUTIONS.values())
            or name in PINNED_ALSO or name.startswith('nvidia-'))


def has_module(name: str) -> bool:
    importlib.invalidate_caches()
    return importlib.util.find_spec(name) is not None


def write_constraints(present: dict, folder: str) -> str:
    path = osp.join(folder, 'present-stack.txt')
    with open(path, 'w') as f:
        for name, version in sorted(present.items()):
            if protected(name):
                f.write(f'{name}=={version}\n')
    return path


def pip_install(constraints: str, *args) -> None:
    cmd = [sys.executable, '-m', 'pip', 'install', '-c', constraints, *args]
    print('+', ' '.join(cmd), flush=True)
    subprocess.check_call(cmd)


def refuse_present_unsupported() -> None:
    """Stop before installing anything when a present release is outside
    the supported range: replacing it is the user's decision."""
    wrong = [
        problem for problem in STACK.stack_problems()
        if ' is installed' in problem and 'not installed' not in problem
    ]
    if wrong:
        sys.exit('bootstrap: nothing installed; this stack has releases '
                 'mmdata_plugin does not support:\n  - ' +
                 '\n  - '.join(wrong))


def requirements_of(distribution: str) -> list:
    """``distribution``'s unconditional requirements, less those whose
    module is already importable (another distribution may ship it)."""
    importlib.invalidate_caches()
    kept = []
    for text in importlib.metadata.requires(distribution) or []:
        if re.search(r'\bextra\s*==', text):
            continue
        name = canonical(re.match(r'[A-Za-z0-9._-]+', text).group(0))
        ships = [
            module for module, dists in MODULE_DISTRIBUTIONS.items()
            if name in dists
        ]
        if ships and has_module(ships[0]):
            print(f'{distribution} asks for {text}; a {ships[0]} module is '
                  'present: keeping it')
            continue
        kept.append(text)
    return kept


def ensure_stack(constraints: str) -> None:
    if has_module('torch'):
        print('a torch module is present; keeping it')
    else:
        pip_install(constraints, TORCH_PIN)
    if has_module('mmengine'):
        print('an mmengine module is present; keeping it')
    else:
        pip_install(constraints, MMENGINE_REQUIREMENT)
    if has_module('mmcv'):
        print('an mmcv module is present; keeping it')
    else:
        pip_install(constraints, '--no-deps', MMCV_LITE_PIN)
        missing = requirements_of('mmcv-lite')
        if missing:
            pip_install(constraints, *missing)
    if has_module('cv2'):
        print('a cv2 module is present; keeping it')
    else:
        pip_install(constraints, CV2_DISTRIBUTION)


def no_deps_files(extras: str) -> list:
    """The requirements files that ``extras`` (comma-separated) install
    with ``--no-deps``, after the package and its extras."""
    return [
        NO_DEPS_EXTRAS[extra] for extra in extras.split(',')
        if extra in NO_DEPS_EXTRAS
    ]


def changed(before: dict, after: dict) -> list:
    """Protected distributions whose version changed or that went away,
    and distributions added for a module that was already present."""
    problems = [
        f'{name} {version} -> {after.get(name, "removed")}'
        for name, version in sorted(before.items())
        if protected(name) and after.get(name) != version
    ]
    for module, names in MODULE_DISTRIBUTIONS.items():
        had, has = names & set(before), names & set(after)
        if had and has - had:
            problems.append(f'{", ".join(sorted(has - had))} installed '
                            f'beside {", ".join(sorted(had))} ({module})')
    return problems


def pkg_resources_note():
    """What to install for configs that inherit a codebase's config by its
    scoped name, when this Python cannot import pkg_resources; else None."""
    if importlib.util.find_spec('pkg_resources') is not None:
        return None
    # installed by now: the message the tools give for the same reason
    from mmdata_plugin.utils.tool_config import PKG_RESOURCES_HINT
    return f'note: no pkg_resources here. {PKG_RESOURCES_HINT}.'


def main():
    parser = argparse.ArgumentParser(
        description='Install mmdata_plugin into this Python, adding only '
        'what is missing')
    parser.add_argument(
        '--extras',
        default='',
        help='comma-separated extras of the package, e.g. tests,mim; '
        'bench: LitData and MosaicML Streaming for '
        'tools/benchmark_remote_cache.py (without their declared '
        'requirements)')
    args = parser.parse_args()
    refuse_present_unsupported()
    before = present_distributions()
    with tempfile.TemporaryDirectory() as folder:
        constraints = write_constraints(before, folder)
        ensure_stack(constraints)
        target = ROOT + (f'[{args.extras}]' if args.extras else '')
        pip_install(constraints, target)
        for requirements in no_deps_files(args.extras):
            pip_install(constraints, '--no-deps', '-r', requirements)
    problems = changed(before, present_distributions())
    if problems:
        sys.exit('bootstrap: the install changed the stack it must keep:\n'
                 '  - ' + '\n  - '.join(problems))
    # Run from the repository root, `import mmdata_plugin` finds the
    # checkout; elsewhere the installed copy. Either way the stack is whole.
    os.chdir(ROOT)
    sys.path.insert(0, ROOT)
    import mmdata_plugin  # noqa: F401  (its import checks the stack)
    note = pkg_resources_note()
    if note:
        print(note)


if __name__ == '__main__':
    main()
