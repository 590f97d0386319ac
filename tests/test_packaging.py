# SPDX-License-Identifier: BSD-2-Clause
"""Packaging: only ``roce_hw`` is installed, its public API, and a LICENSE matching pyproject."""

import os
import re
import shutil
import site
import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT

__all__ = []

#: Repository-root tools that must never be installed (they run from a checkout).
ROOT_TOOLS = ("build", "sim", "bench", "platforms", "tests")


def _pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _roce_hw_packages():
    return sorted(".".join(p.parent.relative_to(ROOT).parts)
                  for p in (ROOT / "roce_hw").rglob("__init__.py"))


def test_package_discovery_is_limited_to_roce_hw():
    from setuptools import find_packages
    tool = _pyproject()["tool"]["setuptools"]
    assert "py-modules" not in tool and set(tool["packages"]) == {"find"}
    include = tool["packages"]["find"]["include"]
    found = sorted(find_packages(where=str(ROOT), include=include))
    assert found == _roce_hw_packages()
    assert {"roce_hw", "roce_hw.lib", "roce_hw.tx", "roce_hw.rx", "roce_hw.ctrl",
            "roce_hw.model"} <= set(found)


def _copy_checkout(dest):
    """The files a clone has (tracked or not yet added), without generated ones."""
    ignore = shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".pytest_cache",
                                    ".hypothesis", ".git", "*.vcd")
    shutil.copytree(ROOT, dest, ignore=ignore)
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wheel")
    src = _copy_checkout(tmp / "src")
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                          "--no-build-isolation", "-w", str(tmp / "dist"), str(src)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    (whl,) = (tmp / "dist").glob("*.whl")
    return whl


def test_test_extras_hold_the_build_requirements():
    """The packaging tests build with ``--no-build-isolation`` (no network), so ``.[test]``
    must install what ``[build-system]`` requires, with the same lower bounds."""
    def reqs(items):
        return {re.match(r"[A-Za-z0-9_.-]+", r).group().lower(): r for r in items}
    py = _pyproject()
    build = reqs(py["build-system"]["requires"])
    test = reqs(py["project"]["optional-dependencies"]["test"])
    assert {name: test.get(name) for name in build} == build


def test_wheel_holds_only_roce_hw(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    dist_info = {t for t in tops if t.endswith(".dist-info")}
    assert tops - dist_info == {"roce_hw"}, sorted(tops)
    packages = sorted({".".join(Path(n).parent.parts) for n in names
                       if n.endswith("/__init__.py")})
    assert packages == _roce_hw_packages()
    (di,) = dist_info
    assert any(n.startswith(f"{di}/") and "LICENSE" in n for n in names), "LICENSE not shipped"


def _site_dirs():
    """The site directories of the interpreter running the tests: a virtualenv's own
    site-packages (plus its base's with ``--system-site-packages``), or the system Python's,
    and the user site. Directories only, never what their ``.pth`` files add to ``sys.path``
    (an editable install of this checkout puts the checkout itself there)."""
    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return [d for d in dict.fromkeys(dirs) if os.path.isdir(d)]


def _fresh_venv(env_dir):
    """A new virtualenv at ``env_dir`` that sees the test environment's packages (pip,
    setuptools, wheel, Amaranth: no download) and nothing else; returns its python.

    Not ``system_site_packages=True``: that gives the *base* interpreter's packages, which in a
    fresh ``python3 -m venv`` are not the ones the test extras installed (a base with only
    setuptools 65 and no ``wheel`` failed: "invalid command 'bdist_wheel'"). The test
    environment's site directories go into a ``.pth`` file instead, after the new venv's own
    site-packages, so its editable install is found first."""
    venv.EnvBuilder(system_site_packages=False, with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    purelib = subprocess.run([str(py), "-c",
                              "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    (Path(purelib) / "_roce_hw_test_env.pth").write_text("".join(f"{d}\n" for d in _site_dirs()))
    return py


def test_editable_install_does_not_pollute_the_namespace(tmp_path):
    """``pip install -e .`` in a fresh virtualenv: from another folder ``import sim`` fails,
    ``import build`` does not find build.py, and the public API imports."""
    src = _copy_checkout(tmp_path / "src")
    py = _fresh_venv(tmp_path / "venv")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    res = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps",
                          "--no-build-isolation", "-e", str(src)],
                         capture_output=True, text=True, timeout=600, env=env)
    assert res.returncode == 0, res.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    def run(code):
        return subprocess.run([str(py), "-c", code], cwd=elsewhere, capture_output=True,
                              text=True, timeout=300, env=env)

    for mod in ("sim", "bench", "platforms", "tests"):
        res = run(f"import {mod}")
        assert res.returncode != 0 and "ModuleNotFoundError" in res.stderr, (mod, res.stderr)
    # `build` may exist as pypa's build tool; it must not be roce-hw's build.py
    res = run("import build, os; print(os.path.realpath(build.__file__))")
    assert res.returncode != 0 or str(src) not in res.stdout, res.stdout
    res = run("from roce_hw import TxEngine, EngineConfig, TxTop, generate, lint, FrameFifo\n"
              "import roce_hw, inspect\n"
              "assert inspect.isfunction(generate) and roce_hw.generate is generate\n"
              "print(roce_hw.__file__)")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().startswith(str(src)), res.stdout


def test_public_api():
    import roce_hw
    from roce_hw.config import EngineConfig
    from roce_hw.generate import generate
    from roce_hw.top import TxTop
    from roce_hw.engine import TxEngine
    for name in roce_hw.__all__:
        assert getattr(roce_hw, name) is not None, name
    assert roce_hw.TxEngine is TxEngine and roce_hw.EngineConfig is EngineConfig
    assert roce_hw.TxTop is TxTop and roce_hw.generate is generate
    import roce_hw.generate    # noqa: F401  importing the module keeps the function visible
    assert roce_hw.generate is generate


def test_license_matches_pyproject():
    assert _pyproject()["project"]["license"] == {"text": "BSD-2-Clause"}
    text = (ROOT / "LICENSE").read_text()
    assert text.splitlines()[0] == "BSD 2-Clause License"
    assert "The roce-hw developers" in text.splitlines()[2]
    assert "Redistributions in binary form must reproduce" in text
    assert "3." not in text            # the 2-clause text, not the 3-clause one
    for path in [ROOT / "build.py", *ROOT.glob("roce_hw/**/*.py"), *ROOT.glob("sim/*.py"),
                 *ROOT.glob("bench/*.py")]:
        head = path.read_text().splitlines()[:3]
        assert "# SPDX-License-Identifier: BSD-2-Clause" in head, path
