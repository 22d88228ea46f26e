"""Builds the pinstage Python package with the project's CMake (docs/python.md, "Install").

setuptools (Debian's python3-setuptools) drives CMake: `pip install --no-build-isolation .`
needs nothing from PyPI, but it needs `wheel` where setuptools is older than 70.1 (Debian's
python3-wheel; a plain `python3 -m venv` has none: `pip install wheel` there first, or let
pip fetch it by leaving out --no-build-isolation). The extension, libpinstage, its companion
libraries, the backend plugins and the CLI (as pinstage-cli, run by the `pinstage` console
command, python/pinstage/_cli.py) are built in one CMake tree with RUNPATH $ORIGIN and
copied side by side into the package folder, where libpinstage finds the plugins next to
itself (src/runtime/plugin.cpp, plugin_dir()).

Environment:
  PINSTAGE_CMAKE_BUILD_DIR  reuse this CMake build folder (incremental rebuilds)
  PINSTAGE_CMAKE_ARGS       extra CMake arguments, e.g. "-DPINSTAGE_CUDA=OFF"
"""
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = pathlib.Path(__file__).resolve().parent


def require_bdist_wheel():
    """pip builds a wheel with setuptools' bdist_wheel, which setuptools < 70.1 takes from
    the `wheel` package; --no-build-isolation does not install it (pyproject.toml's
    build-system.requires), and setuptools' own error ("invalid command 'bdist_wheel'")
    does not say what to do."""
    if not {"bdist_wheel", "dist_info"} & set(sys.argv):  # a wheel, or its metadata first
        return
    try:
        import setuptools.command.bdist_wheel  # noqa: F401  setuptools >= 70.1
        return
    except ImportError:
        pass
    try:
        import wheel  # noqa: F401
    except ImportError:
        sys.exit("pinstage: building a wheel needs the 'wheel' package here (this setuptools "
                 "has no bdist_wheel of its own): run `python -m pip install wheel` first "
                 "(Debian: apt install python3-wheel), or leave out --no-build-isolation so "
                 "pip installs it for the build (docs/python.md, \"Install\")")


require_bdist_wheel()


def project_version():
    """The one version: the project(pinstage VERSION x.y.z ...) line of CMakeLists.txt."""
    text = (ROOT / "CMakeLists.txt").read_text()
    match = re.search(r"project\(\s*pinstage\s+VERSION\s+([0-9][0-9.]*)", text)
    if not match:
        raise RuntimeError("CMakeLists.txt has no project(pinstage VERSION ...) line")
    return match.group(1)


class CMakeBuild(build_ext):
    """Configures and builds the CMake project, then copies its shared objects."""

    def build_extension(self, ext):
        build = pathlib.Path(os.environ.get("PINSTAGE_CMAKE_BUILD_DIR")
                             or pathlib.Path(self.build_temp).resolve() / "cmake")
        build.mkdir(parents=True, exist_ok=True)
        configure = [
            "cmake", "-S", str(ROOT), "-B", str(build),
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DPython_EXECUTABLE={sys.executable}",
            "-DPINSTAGE_BUILD_PYTHON=ON", "-DPINSTAGE_BUILD_TESTS=OFF",
            "-DPINSTAGE_BUILD_BENCH=OFF",
            # Every library carries RUNPATH $ORIGIN: the package folder holds them all.
            "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON", "-DCMAKE_INSTALL_RPATH=$ORIGIN",
        ]
        if shutil.which("ninja"):
            configure += ["-G", "Ninja"]
        if shutil.which("ccache"):
            configure += ["-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
        configure += shlex.split(os.environ.get("PINSTAGE_CMAKE_ARGS", ""))
        subprocess.run(configure, check=True)
        targets = ["_pinstage", "pinstage_cli"] + self.plugin_targets(build)
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1))
        subprocess.run(["cmake", "--build", str(build), "-j", jobs, "--target", *targets],
                       check=True)
        out = pathlib.Path(self.get_ext_fullpath(ext.name)).parent
        out.mkdir(parents=True, exist_ok=True)
        extension = next((build / "python" / "pinstage").glob("_pinstage*.so"))
        shutil.copy2(extension, out / extension.name)
        for lib in sorted((build / "lib").glob("libpinstage*.so*")):
            shutil.copy2(lib, out / lib.name, follow_symlinks=True)
        # The CLI beside the libraries (RUNPATH $ORIGIN): the `pinstage` command runs it.
        shutil.copy2(build / "bin" / "pinstage", out / "pinstage-cli")

    @staticmethod
    def plugin_targets(build):
        """Every backend plugin the configured tree can build (pinstage_backend_*)."""
        help_text = subprocess.run(["cmake", "--build", str(build), "--target", "help"],
                                   check=True, capture_output=True, text=True).stdout
        return sorted(set(re.findall(r"\b(pinstage_backend_\w+?)(?=:|\s)", help_text)))


setup(
    version=project_version(),
    packages=["pinstage"],
    package_dir={"pinstage": "python/pinstage"},
    package_data={"pinstage": ["py.typed", "*.pyi"]},
    ext_modules=[Extension("pinstage._pinstage", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    entry_points={"console_scripts": ["pinstage = pinstage._cli:main"]},
    # Keep setuptools' own build and egg-info folders out of the source tree's way.
    options={"build": {"build_base": "build-pip"}, "egg_info": {"egg_base": "build-pip"}},
    zip_safe=False,
)
