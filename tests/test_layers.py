# SPDX-License-Identifier: BSD-2-Clause
"""The package's layers import one way only (README "Architecture", docs/architecture.md).

Every ``import`` of every module of ``roce_hw`` -- at module level or inside a function -- is read
with :mod:`ast` and checked against the layer table below: hardware never imports the models it
is tested against (``roce_hw.model``) or the host tool; the models and the host tool never import
hardware (nor Amaranth); a datapath never imports the control plane; nothing in the package
imports the repository's tools (``sim``, ``bench``, ``build``, ``tests``).
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "roce_hw"

#: layer -> the layers it may import (besides itself and the standard library).
DEFS = {"roce_hw.proto", "roce_hw.config"}
ALLOWED = {
    "defs": set(),                                    # proto, config: the standard library only
    "model": {"defs"},
    "host": {"defs"},
    "hwdefs": {"defs"},                               # layouts, verbs (Amaranth layouts)
    "lib": {"defs", "hwdefs"},
    "tx": {"defs", "hwdefs", "lib"},
    "rx": {"defs", "hwdefs", "lib"},
    "ctrl": {"defs", "hwdefs", "lib", "tx", "rx"},
    "mac": {"defs", "hwdefs", "lib"},                 # the 1G MAC: beside the engine, not in it
    "engine": {"defs", "hwdefs", "lib", "tx", "rx", "ctrl"},
    "top": {"defs", "hwdefs", "lib", "tx", "rx", "ctrl", "engine", "package"},  # __version__
    "package": {"top"},                               # roce_hw/__init__ (lazy public API)
}
#: layers that must not import Amaranth (they run on a host without it).
PURE = {"defs", "model", "host"}
TOOLS = ("sim", "bench", "build", "tests", "platforms")


def layer_of(module):
    parts = module.split(".")
    if module in DEFS:
        return "defs"
    if module == "roce_hw":
        return "package"
    if module in ("roce_hw.layouts", "roce_hw.verbs"):
        return "hwdefs"
    if module == "roce_hw.engine":
        return "engine"
    if module in ("roce_hw.top", "roce_hw.generate"):
        return "top"
    if len(parts) >= 2 and parts[1] in ("model", "host", "lib", "tx", "rx", "ctrl", "mac"):
        return parts[1]
    raise AssertionError(f"{module}: no layer assigned; add it to tests/test_layers.py")


def module_name(path):
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path):
    """``(line, imported module)`` of every import in the file, relative ones resolved."""
    mod = module_name(path)
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            if node.module is None or node.level:
                # "from . import x" / "from .. import proto": x may be a module
                for alias in node.names:
                    candidate = f"{target}.{alias.name}"
                    yield node.lineno, candidate if _is_module(candidate) else target
            else:
                yield node.lineno, target


def _is_module(name):
    p = ROOT.joinpath(*name.split("."))
    return p.with_suffix(".py").exists() or (p / "__init__.py").exists()


def _owner(module):
    """The ``roce_hw`` module a dotted import names (the longest prefix that is a file)."""
    parts = module.split(".")
    while parts and not _is_module(".".join(parts)):
        parts.pop()
    return ".".join(parts)


def violations():
    out = []
    for path in sorted(PKG.rglob("*.py")):
        mod = module_name(path)
        layer = layer_of(mod)
        for line, target in imports_of(path):
            where = f"{path.relative_to(ROOT)}:{line}: {mod} ({layer}) imports {target}"
            top = target.split(".")[0]
            if top in TOOLS:
                out.append(where + ": the package never imports the repository's tools")
            elif top == "amaranth" and layer in PURE:
                out.append(where + ": this layer is pure Python")
            elif top == "roce_hw":
                other = layer_of(_owner(target))
                if other != layer and other not in ALLOWED[layer]:
                    out.append(where + f" ({other})")
    return out


def test_imports_go_one_way():
    assert violations() == []


@pytest.mark.parametrize("source, bad", [
    ("from ..model.cm import COUNTERS\n", "roce_hw.model.cm"),
    ("from ..ctrl.cm import CmResponder\n", "roce_hw.ctrl.cm"),
    ("import sim.replay\n", "sim.replay"),
    ("from amaranth import Signal\n", "amaranth"),
])
def test_a_wrong_way_import_is_found(tmp_path, monkeypatch, source, bad):
    # The checker itself: a hardware module importing its model, a datapath importing the
    # control plane, the package importing a tool, a model importing Amaranth.
    target = {"roce_hw.model.cm": PKG / "tx" / "_probe.py",
              "roce_hw.ctrl.cm": PKG / "rx" / "_probe.py",
              "sim.replay": PKG / "lib" / "_probe.py",
              "amaranth": PKG / "model" / "_probe.py"}[bad]
    target.write_text(source)
    try:
        found = violations()
    finally:
        target.unlink()
    assert len(found) == 1 and bad in found[0], found
