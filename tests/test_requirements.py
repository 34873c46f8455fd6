"""What installing the package brings into an environment."""
import importlib.metadata
import importlib.util
import os.path as osp

from packaging.requirements import Requirement

from helpers import REPO_ROOT

# Distributions that install the `cv2` module, all into one folder.
CV2_DISTRIBUTIONS = {
    'opencv-python', 'opencv-python-headless', 'opencv-contrib-python',
    'opencv-contrib-python-headless'
}


def _read_requirements(name):
    spec = importlib.util.spec_from_file_location(
        'mmdata_plugin_setup', osp.join(REPO_ROOT, 'setup.py'))
    setup = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(setup)
    return setup.read_requirements(name)


def _cv2_names(requirements):
    names = set()
    for text in requirements:
        requirement = Requirement(text)
        if requirement.marker is None or requirement.marker.evaluate(
                dict(extra='')):
            names.add(requirement.name.lower())
    return names & CV2_DISTRIBUTIONS


def test_cv2_comes_from_the_distribution_the_openmmlab_stack_requires():
    # Asking for another one (opencv-python-headless next to mmengine's
    # opencv-python) installs two copies of cv2 into one folder.
    stack = set()
    for dist in ('mmengine', 'mmcv-lite', 'mmcv'):
        try:
            stack |= _cv2_names(importlib.metadata.requires(dist) or [])
        except importlib.metadata.PackageNotFoundError:
            continue
    ours = _cv2_names(_read_requirements('runtime.txt'))
    assert stack, 'mmengine/mmcv no longer name a cv2 distribution'
    assert ours == stack, (f'requirements/runtime.txt asks for {ours}, the '
                           f'OpenMMLab stack for {stack}')


def test_mim_extra_pins_the_openxlab_that_resolves():
    # openmim -> opendatalab -> openxlab; every openxlab after 0.0.11 wants
    # setuptools~=60.2, which the extra's setuptools bound excludes: without
    # the pin pip backtracks through all of them (~80 s) on every install.
    mim = {
        Requirement(text).name.lower(): Requirement(text)
        for text in _read_requirements('mim.txt')
    }
    pin = mim['openxlab'].specifier
    assert len(pin) == 1 and next(iter(pin)).operator == '=='
    try:
        installed = importlib.metadata.version('openxlab')
    except importlib.metadata.PackageNotFoundError:
        return  # the extra is not installed here
    assert pin.contains(installed)
    setuptools = importlib.metadata.version('setuptools')
    assert mim['setuptools'].specifier.contains(setuptools)
    for text in importlib.metadata.requires('openxlab') or []:
        requirement = Requirement(text)
        if requirement.name.lower() == 'setuptools':
            assert requirement.specifier.contains(setuptools), requirement


def test_the_ray_extra_pulls_no_torch_and_no_cuda():
    # The data nodes are CPU machines, and the trainer keeps its torch.
    extras = [Requirement(text) for name in ('ray.txt', 'tests.txt')
              for text in _read_requirements(name)]
    assert {str(r) for r in extras if r.name == 'ray'} == {'ray==2.60.0'}
    try:
        requires = importlib.metadata.requires('ray') or []
    except importlib.metadata.PackageNotFoundError:
        return  # the extra is not installed here
    unconditional = {
        Requirement(text).name.lower()
        for text in requires
        if Requirement(text).marker is None
        or Requirement(text).marker.evaluate(dict(extra=''))
    }
    assert not {
        name for name in unconditional
        if name == 'torch' or name.startswith(('nvidia-', 'cupy'))
    }, unconditional
