import os
import os.path as osp
import shutil
import sys

from setuptools import find_packages, setup

HERE = osp.dirname(osp.abspath(__file__))
# What `mim train mmdata_plugin CONFIG` looks for in <package>/.mim.
MIM_FOLDERS = ('tools', 'configs')


def read_version():
    namespace = {}
    with open(osp.join(HERE, 'mmdata_plugin', 'version.py')) as f:
        exec(f.read(), namespace)
    return namespace['__version__']


def read_requirements(name):
    with open(osp.join(HERE, 'requirements', name)) as f:
        return [
            line.split('#')[0].strip() for line in f
            if line.split('#')[0].strip()
        ]


def add_mim_extension():
    """Put tools/ and configs/ into mmdata_plugin/.mim for `mim train`.

    An editable install links them (edits show up at once); a regular
    install or wheel build copies them, so the installed package carries
    them.
    """
    editable = any(cmd in sys.argv
                   for cmd in ('develop', 'editable_wheel'))
    if not editable and not any(
            cmd in sys.argv for cmd in ('install', 'bdist_wheel', 'sdist',
                                        'build', 'build_py')):
        return
    mim_path = osp.join(HERE, 'mmdata_plugin', '.mim')
    os.makedirs(mim_path, exist_ok=True)
    for folder in MIM_FOLDERS:
        src = osp.join(HERE, folder)
        dst = osp.join(mim_path, folder)
        if osp.islink(dst) or osp.isfile(dst):
            os.remove(dst)
        elif osp.isdir(dst):
            shutil.rmtree(dst)
        if editable:
            os.symlink(osp.relpath(src, mim_path), dst)
        else:
            shutil.copytree(src, dst)


if __name__ == '__main__':
    add_mim_extension()
    setup(
        name='mmdata_plugin',
        version=read_version(),
        description='Fast resume, rank-sharded datasets and data-loading '
        'diagnostics for mmengine / OpenMMLab training',
        long_description=open(osp.join(HERE, 'README.md'),
                              encoding='utf-8').read(),
        long_description_content_type='text/markdown',
        license='Apache License 2.0',
        python_requires='>=3.10',
        packages=find_packages(exclude=('configs', 'tools', 'tests',
                                        'docs')),
        include_package_data=True,
        package_data={'mmdata_plugin': ['.mim/**/*']},
        install_requires=read_requirements('runtime.txt'),
        extras_require={
            'tests': read_requirements('tests.txt'),
            'mim': read_requirements('mim.txt'),
            's3': read_requirements('s3.txt'),
            'ray': read_requirements('ray.txt'),
            # LitData and MosaicML Streaming themselves are installed
            # with --no-deps by tools/bootstrap.py --extras bench.
            'bench': read_requirements('bench.txt'),
        },
        zip_safe=False,
    )
