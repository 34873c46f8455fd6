"""What installing the package brings into an environment."""
import importlib.metadata
import importlib.util
import os.path as osp

from packaging.requirements import Requirement

from helpers import REPO_ROOT

from mmdata_plugin.supported_stack import MMCV, MMENGINE, MODULE_DISTRIBUTIONS


def _read_requirements(name):
    spec = importlib.util.spec_from_file_location(
        'mmdata_plugin_setup', osp.join(REPO_ROOT, 'setup.py'))
    setup = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(setup)
    return setup.read_requirements(name)


def test_an_install_names_no_distribution_of_the_users_stack():
    # torch, mmengine (or onedl-mmengine), mmcv (-lite, onedl-) and cv2
    # (opencv-python or -headless) are the user's: naming one here installs
    # it over the user's other distribution of the same module.
    stack = {
        name
        for names in MODULE_DISTRIBUTIONS.values() for name in names
        if name != 'numpy'
    }
    runtime = {
        Requirement(text).name.lower()
        for text in _read_requirements('runtime.txt')
    }
    assert runtime, 'requirements/runtime.txt is empty'
    assert not runtime & stack, runtime & stack


def test_mim_install_asks_for_the_ranges_the_import_accepts():
    wanted = {
        Requirement(text).name: Requirement(text).specifier
        for text in _read_requirements('mminstall.txt')
    }
    for name, allowed in (('mmengine', MMENGINE), ('mmcv', MMCV)):
        low, high = ('.'.join(map(str, bound))
                     for bound in (allowed.low, allowed.high))
        assert wanted[name].contains(low), (name, low)
        assert not wanted[name].contains(high), (name, high)
        assert wanted[name].contains('.'.join(
            map(str, allowed.newest_tested))), name


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
