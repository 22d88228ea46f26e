"""Builds the pinstage Python package with the project's CMake (docs/python.md, "Install").

setuptools (Debian's python3-setuptools) drives CMake: `pip install --no-build-isolation .`
needs nothing from PyPI, but it needs `wheel` where setuptools is older than 70.1 (Debian's
python3-wheel; a plain `python3 -m venv` has none: `pip install wheel` there first, or let
pip fetch it by leaving out --no-build-isolation). The extension, libpinstage, its companion
libraries, the backend plugins and the CLI (as pinstage-cli, run by the `pinstage` console
command, python/pinstage/_cli.py, declared in pyproject.toml) are built in one CMake tree
with what the package ships only (no tests, benchmarks or tools) and RUNPATH $ORIGIN
everywhere (PINSTAGE_PYTHON_PACKAGE), and copied side by side into the package folder,
where libpinstage finds the plugins next to itself (src/runtime/plugin.cpp, plugin_dir()).

Environment:
  PINSTAGE_CMAKE_BUILD_DIR  the CMake build folder (default build-pip-cmake beside this
                            file: a rebuild is incremental, and ccache shares objects with
                            scripts/build.sh's build/, a folder of the same depth)
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
                             or ROOT / "build-pip-cmake")
        build.mkdir(parents=True, exist_ok=True)
        configure = [
            "cmake", "-S", str(ROOT), "-B", str(build),
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DPython_EXECUTABLE={sys.executable}",
            # What the package ships, nothing more: its default target is the lot.
            "-DPINSTAGE_BUILD_PYTHON=ON", "-DPINSTAGE_BUILD_TESTS=OFF",
            "-DPINSTAGE_BUILD_BENCH=OFF", "-DPINSTAGE_BUILD_TOOLS=OFF",
            # Every binary carries RUNPATH $ORIGIN: the package folder holds them all.
            "-DPINSTAGE_PYTHON_PACKAGE=ON", "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
        ]
        env = dict(os.environ)
        if shutil.which("ninja"):
            configure += ["-G", "Ninja"]
        if shutil.which("ccache"):
            configure += ["-DCMAKE_CXX_COMPILER_LAUNCHER=ccache",
                          "-DCMAKE_C_COMPILER_LAUNCHER=ccache"]
            # scripts/ccache-env.sh's keys: objects shared with any clone's build/.
            for key, value in (("CCACHE_BASEDIR", str(ROOT)), ("CCACHE_NOHASHDIR", "1"),
                               ("CCACHE_IGNOREOPTIONS", "-fmacro-prefix-map=*")):
                env.setdefault(key, value)
        configure += shlex.split(os.environ.get("PINSTAGE_CMAKE_ARGS", ""))
        subprocess.run(configure, check=True, env=env)
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1))
        subprocess.run(["cmake", "--build", str(build), "-j", jobs], check=True, env=env)
        out = pathlib.Path(self.get_ext_fullpath(ext.name)).parent
        out.mkdir(parents=True, exist_ok=True)
        extension = next((build / "python" / "pinstage").glob("_pinstage*.so"))
        shutil.copy2(extension, out / extension.name)
        for lib in sorted((build / "lib").glob("libpinstage*.so*")):
            shutil.copy2(lib, out / lib.name, follow_symlinks=True)
        # Each plugin's description (pinstage_add_backend) goes with it: pinstage.backends().
        for description in sorted((build / "lib").glob("libpinstage_backend_*.backend")):
            shutil.copy2(description, out / description.name)
        # The CLI beside the libraries (RUNPATH $ORIGIN): the `pinstage` command runs it.
        shutil.copy2(build / "bin" / "pinstage", out / "pinstage-cli")


# setuptools' own build and egg-info folder (the options below): egg_info refuses a missing
# egg_base, and an isolated `pip install .` of a fresh clone runs egg_info first.
(ROOT / "build-pip").mkdir(exist_ok=True)

setup(
    version=project_version(),
    packages=["pinstage"],
    package_dir={"pinstage": "python/pinstage"},
    package_data={"pinstage": ["py.typed", "*.pyi"]},
    ext_modules=[Extension("pinstage._pinstage", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    # Keep setuptools' own build and egg-info folders out of the source tree's way.
    options={"build": {"build_base": "build-pip"}, "egg_info": {"egg_base": "build-pip"}},
    zip_safe=False,
)
