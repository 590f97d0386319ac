# SPDX-License-Identifier: BSD-2-Clause
"""Build the soft-RoCE guest: a stock Debian kernel plus an uncompressed initramfs.

Everything comes from Debian packages fetched *by name* with ``apt-get download`` (the host's
apt sources), unpacked with ``dpkg-deb -x`` into one root; nothing is compiled. The kernel
modules the guest needs are found from the ``depends=`` fields of the kernel's own ``.ko``
files (the same closure ``modprobe --show-depends`` prints), so the host needs no kmod.

The result is cached under ``build/rxe-guest/<key>/`` where ``key`` hashes every input: the
package lists, the module list, ``init.sh``, ``agent.py``, the ``extra/`` guest files and this
builder. A second build with the same inputs returns at once; downloaded ``.deb`` files are kept
in ``build/rxe-guest/debs/`` and reused across keys.

Repository code the guest runs (the host tool ``python -m roce_hw.host``) is *not* in that image:
:func:`python_closure` finds the pure-Python modules a package needs (its own files and every
repository module imported at module level, transitively; anything importing Amaranth or a
package the guest lacks is refused), and :func:`write_python_layer` writes them as a second,
small ``newc`` archive under ``/opt/rxe/pylib`` (:data:`PYLIB`). The kernel unpacks
concatenated archives one after the other, so :class:`sim.vm.RxeVM` boots the cached image with
that layer appended, built afresh from the working tree at every boot: the guest always runs the
current code, and editing it never invalidates (or rebuilds) the cached image.
"""

import ast
import fcntl
import gzip
import hashlib
import json
import lzma
import os
import re
import shutil
import stat
import struct
import subprocess
import sys
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

__all__ = ["GUEST_PACKAGES", "KERNEL_PACKAGE", "GUEST_MODULES", "SKIP_PACKAGES", "GuestImage",
           "GuestBuildError", "image_key", "build_image", "find_qemu", "DEFAULT_BUILD_DIR",
           "GUEST_PYTHON", "PYLIB", "python_closure", "write_python_layer"]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

#: Where images and downloaded packages go (gitignored).
DEFAULT_BUILD_DIR = ROOT / "build" / "rxe-guest"

#: The user-space packages of the guest (their dependency closure is added).
GUEST_PACKAGES = ("python3-pyverbs", "ibverbs-providers", "ibverbs-utils", "libibverbs1",
                  "iproute2", "python3", "busybox-static")

#: The kernel meta-package; its one dependency (the versioned image) is what is unpacked.
KERNEL_PACKAGE = "linux-image-amd64"

#: Kernel modules loaded by ``/init`` (with their dependencies, in dependency order).
GUEST_MODULES = ("crc32_generic", "virtio_pci", "virtio_net", "ib_uverbs", "rdma_rxe")

#: Packages the closure does not follow: maintainer-script and init machinery a one-process
#: initramfs never runs (and everything only they pull in).
SKIP_PACKAGES = frozenset({
    "perl", "perl-base", "perl-modules-5.36", "libperl5.36", "debconf", "cdebconf", "debconf-2.0",
    "dpkg", "udev", "adduser", "passwd", "install-info", "init-system-helpers", "lsb-base",
    "usrmerge", "usr-is-merged", "sysvinit-utils", "tar", "mailcap", "mime-support",
    "media-types", "rdma-core", "libpam-modules", "libpam-modules-bin", "libpam0g",
    "libsemanage2", "libsemanage-common", "libelogind0", "libsystemd0", "libudev1",
})

#: Trees dropped from the root to keep the initramfs small (documentation, locales, tests).
_PRUNE = ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale",
          "usr/lib/x86_64-linux-gnu/gconv",
          "usr/share/lintian", "usr/lib/python3.11/test", "usr/lib/python3.11/idlelib",
          "usr/lib/python3.11/tkinter", "usr/lib/python3.11/lib2to3",
          "usr/lib/python3.11/ensurepip", "usr/lib/python3.11/pydoc_data")

#: Repository packages the guest can import (:func:`python_closure` of each, in the layer).
GUEST_PYTHON = ("roce_hw.host",)

#: Where the layer puts them in the guest (``PYTHONPATH`` of programs run there).
PYLIB = "/opt/rxe/pylib"

#: Third-party modules the guest has (beside the standard library): pyverbs (python3-pyverbs).
_GUEST_THIRD_PARTY = frozenset({"pyverbs"})

#: Standard-library trees pruned from the image (:data:`_PRUNE`); importing them would fail.
_PRUNED_STDLIB = frozenset({"test", "idlelib", "tkinter", "lib2to3", "ensurepip", "pydoc_data"})

INIT_SCRIPT = HERE / "init.sh"
AGENT_SOURCE = HERE / "agent.py"
#: Further guest-side Python files (e.g. a host CM client) installed beside the agent.
EXTRA_DIR = HERE / "extra"


class GuestBuildError(RuntimeError):
    """The guest image cannot be built (missing tool, apt failure, unexpected package)."""


@dataclass
class GuestImage:
    """A built guest: boot ``kernel`` with ``initrd``; ``info`` has versions and sizes."""
    kernel: Path
    initrd: Path
    key: str
    info: dict


def find_qemu():
    """Path of ``qemu-system-x86_64`` or a :class:`GuestBuildError` saying how to install it."""
    path = shutil.which("qemu-system-x86_64")
    if path is None:
        raise GuestBuildError("qemu-system-x86_64 not found: install it with "
                              "`apt-get install qemu-system-x86` (Debian/Ubuntu)")
    return path


def _need(tool):
    if shutil.which(tool) is None:
        raise GuestBuildError(f"`{tool}` not found: the guest image is built from Debian packages "
                              f"with apt-get and dpkg-deb (a Debian or Ubuntu host with apt)")


def _guest_files():
    """(name in guest, path on host) of every file shipped from this repository."""
    files = [("init", INIT_SCRIPT), ("opt/rxe/agent.py", AGENT_SOURCE)]
    if EXTRA_DIR.is_dir():
        for p in sorted(EXTRA_DIR.rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts:
                files.append((f"opt/rxe/{p.relative_to(EXTRA_DIR).as_posix()}", p))
    return files


def image_key():
    """Hash of every input of the image (a changed input means a new image)."""
    h = hashlib.sha256()
    h.update(json.dumps([GUEST_PACKAGES, KERNEL_PACKAGE, GUEST_MODULES,
                         sorted(SKIP_PACKAGES), _PRUNE]).encode())
    for name, path in _guest_files() + [("builder", Path(__file__))]:
        h.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _module_path(name, root):
    """``(path, is_package)`` of repository module ``name`` under ``root``, or ``None``."""
    base = root.joinpath(*name.split("."))
    if (base / "__init__.py").is_file():
        return base / "__init__.py", True
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py"), False
    return None


def _top_level_imports(tree):
    """Import nodes executed when the module is imported: module level, including inside
    ``if``/``try``/``with`` blocks, but not inside functions or classes (lazy imports)."""
    todo = list(tree.body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.If, ast.Try, ast.With)) or \
                type(node).__name__ == "TryStar":
            for field in ("body", "orelse", "finalbody", "handlers"):
                for child in getattr(node, field, []):
                    todo.extend(child.body if isinstance(child, ast.ExceptHandler) else [child])


def python_closure(roots=GUEST_PYTHON, root=ROOT):
    """The repository files the guest needs to import ``roots``: ``[(relative path, Path)]``,
    sorted. A root package brings all its ``.py`` files (``python -m pkg`` runs
    ``__main__``); every module brings its parent packages' ``__init__.py`` and the repository
    modules it imports at module level, transitively. Raises :class:`GuestBuildError` if a
    root does not exist or a module imports, at module level, something the guest does not have
    (Amaranth, any third-party package but pyverbs, a pruned part of the standard library)."""
    import sys
    repo_tops = {p.name for p in root.iterdir()
                 if (p / "__init__.py").is_file() or p.suffix == ".py"}
    files, todo, seen = {}, [], set()

    def want(name, why):
        if name in seen:
            return
        found = _module_path(name, root)
        if found is None:
            raise GuestBuildError(f"{why}: repository module {name} not found")
        seen.add(name)
        todo.append((name, found[0], found[1]))
        parts = name.split(".")
        for k in range(1, len(parts)):
            want(".".join(parts[:k]), why)

    for r in roots:
        found = _module_path(r, root)
        if found is None:
            raise GuestBuildError(f"the guest needs {r}, which does not exist under {root}")
        want(r, r)
        if found[1]:
            for p in sorted(found[0].parent.rglob("*.py")):
                if "__pycache__" not in p.parts:
                    rel = p.relative_to(root).with_suffix("")
                    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
                    want(".".join(parts), r)
    while todo:
        name, path, is_pkg = todo.pop(0)
        rel = path.relative_to(root).as_posix()
        files[rel] = path
        package = name if is_pkg else name.rpartition(".")[0]
        tree = ast.parse(path.read_bytes(), rel)
        for node in _top_level_imports(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
                targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
            else:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for t in targets:
                top = t.split(".")[0]
                if top in repo_tops:
                    if _module_path(t, root) is not None:
                        want(t, rel)
                    elif t == targets[0]:
                        raise GuestBuildError(f"{rel}: imports {t}, which does not exist")
                elif t == targets[0] or isinstance(node, ast.Import):
                    if top == "amaranth":
                        raise GuestBuildError(
                            f"{rel} imports Amaranth at module level; the guest has no "
                            f"Amaranth (import it inside the function that needs it)")
                    if top in _PRUNED_STDLIB:
                        raise GuestBuildError(f"{rel} imports {top}, which the guest image "
                                              f"leaves out")
                    if top not in sys.stdlib_module_names and top not in _GUEST_THIRD_PARTY:
                        raise GuestBuildError(f"{rel} imports {top}, which the guest does not "
                                              f"have (standard library and pyverbs only)")
    return sorted(files.items())


def write_python_layer(path, roots=GUEST_PYTHON, root=ROOT):
    """Write the ``newc`` archive of :func:`python_closure` under :data:`PYLIB` to ``path``
    (to be appended to the image's initramfs); returns ``(key, [relative paths])``, ``key``
    a hash of the files' names and contents."""
    files = python_closure(roots, root)
    h = hashlib.sha256()
    dirs = set()
    for rel, _ in files:
        parts = rel.split("/")[:-1]
        for k in range(1, len(parts) + 1):
            dirs.add("/".join(parts[:k]))
    top = PYLIB.strip("/")
    with open(path, "wb") as f:
        cpio = _Cpio(f)
        cpio.add(top, stat.S_IFDIR | 0o755)          # /opt/rxe exists in the image
        for d in sorted(dirs):
            cpio.add(f"{top}/{d}", stat.S_IFDIR | 0o755)
        for rel, p in files:
            raw = p.read_bytes()
            h.update(rel.encode() + b"\0" + raw + b"\0")
            cpio.add(f"{top}/{rel}", stat.S_IFREG | 0o644, raw)
        cpio.close()
    return h.hexdigest()[:16], [rel for rel, _ in files]


def _run(cmd, **kw):
    try:
        return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout
    except subprocess.CalledProcessError as e:
        raise GuestBuildError(f"`{' '.join(cmd)}` failed (exit {e.returncode}):\n"
                              f"{e.stderr.strip()[-2000:]}") from None


def _dep_closure(roots, log):
    """Names of the packages ``roots`` need (Depends/Pre-Depends, first alternative), not
    following :data:`SKIP_PACKAGES`."""
    seen, todo, bracketed = set(), list(roots), set()
    while todo:
        batch = [p for p in dict.fromkeys(todo) if p not in seen]
        todo = []
        if not batch:
            break
        seen.update(batch)
        out = _run(["apt-cache", "depends", "--no-recommends", "--no-suggests", "--no-conflicts",
                    "--no-breaks", "--no-replaces", "--no-enhances", *batch])
        alt = False
        for line in out.splitlines():
            m = re.match(r"\s+(\|)?(Pre)?Depends: (\S+)", line)
            if m is None:
                # "    pkg" lines after a virtual dependency name its providers: skipped.
                continue
            skip, alt = alt, bool(m.group(1))
            if skip:                     # not the first alternative of the previous group
                continue
            raw = m.group(3)
            name = raw.strip("<>").split(":")[0]
            if raw.startswith("<"):
                bracketed.add(name)
            if name not in seen and name not in SKIP_PACKAGES:
                todo.append(name)
    real = []
    for name in sorted(seen):
        # apt-cache puts virtual names (and ":any" qualified ones) in <...>; keep real ones.
        if name in bracketed and not subprocess.run(
                ["apt-cache", "show", "--no-all-versions", name],
                capture_output=True, text=True).stdout.strip():
            log(f"  (virtual package {name} skipped)")
            continue
        real.append(name)
    return real


def _download(names, debs_dir, log):
    """``apt-get download`` whatever of ``names`` is not in ``debs_dir`` yet; returns the
    ``.deb`` paths (the candidate version of each)."""
    debs_dir.mkdir(parents=True, exist_ok=True)
    want, name = {}, None
    for line in _run(["apt-cache", "policy", *names]).splitlines():
        if line and not line[0].isspace() and line.rstrip().endswith(":"):
            name = line.rstrip()[:-1]
        elif line.strip().startswith("Candidate:") and name in names:
            ver = line.split(":", 1)[1].strip()
            if ver != "(none)":
                want[name] = ver.split(":")[-1]   # file names drop the epoch
    lacking = [n for n in names if n not in want]
    if lacking:
        raise GuestBuildError(f"no installable candidate for {', '.join(lacking)}: "
                              f"run `apt-get update` first")

    def cached():
        have = {}
        for p in debs_dir.glob("*.deb"):
            pkg, ver = urllib.parse.unquote(p.name).split("_")[:2]
            if want.get(pkg) == ver.split(":")[-1]:
                have[pkg] = p
        return have

    have = cached()
    missing = [n for n in names if n not in have]
    if missing:
        log(f"  apt-get download {len(missing)} packages")
        try:
            _run(["apt-get", "download", *missing], cwd=debs_dir)
        except GuestBuildError as e:
            raise GuestBuildError(f"{e}\n(run `apt-get update` once if the package lists are "
                                  f"missing or stale)") from None
        have = cached()
    lost = [n for n in names if n not in have]
    if lost:
        raise GuestBuildError(f"apt-get download did not produce: {', '.join(lost)}")
    return [have[n] for n in names]


def _modinfo(data):
    """The ``.modinfo`` key/value strings of an ELF64 kernel module."""
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    secs = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab = secs[shstrndx]
    for name_off, _, _, _, off, size in secs:
        start = strtab[4] + name_off
        name = data[start:data.index(b"\0", start)]
        if name == b".modinfo":
            return [s.decode(errors="replace") for s in data[off:off + size].split(b"\0") if s]
    return []


def _module_files(kroot, kver, wanted):
    """Module files of ``wanted`` and their ``depends=`` closure, dependencies first:
    ``[(name, bytes)]`` (``.ko.xz``/``.ko.gz`` are decompressed)."""
    mod_dir = kroot / "lib" / "modules" / kver
    if not mod_dir.is_dir():
        mod_dir = kroot / "usr" / "lib" / "modules" / kver
    index = {}
    for p in mod_dir.rglob("*.ko*"):
        base = p.name.split(".ko")[0].replace("-", "_")
        index[base] = p

    def load(p):
        raw = p.read_bytes()
        if p.name.endswith(".xz"):
            raw = lzma.decompress(raw)
        elif p.name.endswith(".gz"):
            raw = gzip.decompress(raw)
        return raw

    order, seen = [], set()

    def visit(name):
        name = name.replace("-", "_")
        if name in seen:
            return
        seen.add(name)
        if name not in index:
            raise GuestBuildError(f"kernel module {name} not found under {mod_dir} "
                                  f"(built into this kernel, or a different kernel?)")
        raw = load(index[name])
        for entry in _modinfo(raw):
            if entry.startswith("depends="):
                for dep in filter(None, entry[8:].split(",")):
                    visit(dep)
        order.append((name, raw))

    for m in wanted:
        visit(m)
    return order


class _Cpio:
    """Writer of an uncompressed ``newc`` cpio archive (what the kernel unpacks as initramfs)."""

    def __init__(self, f):
        self.f, self.ino = f, 1

    def add(self, name, mode, data=b"", rdev=(0, 0)):
        name_b = name.encode() + b"\0"
        hdr = "070701" + "".join(f"{v:08x}" for v in (
            self.ino, mode, 0, 0, 1, 0, len(data), 0, 0, rdev[0], rdev[1], len(name_b), 0))
        self.ino += 1
        self.f.write(hdr.encode() + name_b)
        self.f.write(b"\0" * (-(110 + len(name_b)) % 4))
        self.f.write(data)
        self.f.write(b"\0" * (-len(data) % 4))

    def close(self):
        self.add("TRAILER!!!", 0)


def build_image(build_dir=None, *, force=False, log=None):
    """Build (or find in the cache) the guest image; returns a :class:`GuestImage`.

    Raises :class:`GuestBuildError` with a readable message when a tool is missing or apt fails.
    """
    log = log or (lambda msg: print(msg, file=sys.stderr))
    build_dir = Path(build_dir) if build_dir else DEFAULT_BUILD_DIR
    build_dir.mkdir(parents=True, exist_ok=True)
    # One builder at a time (parallel test workers share the cache).
    with open(build_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build_locked(build_dir, force, log)


def _build_locked(build_dir, force, log):
    key = image_key()
    out = build_dir / key
    info_path = out / "image.json"
    if info_path.is_file() and not force:
        info = json.loads(info_path.read_text())
        return GuestImage(out / "vmlinuz", out / "initrd.cpio", key, info)
    for tool in ("apt-get", "apt-cache", "dpkg-deb"):
        _need(tool)
    t0 = time.monotonic()
    log(f"building the rxe guest image {key} in {out}")
    debs_dir = build_dir / "debs"
    work = build_dir / f"tmp-{key}-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    groot, kroot = work / "root", work / "kernel"
    groot.mkdir(parents=True)
    kroot.mkdir()
    try:
        kpkgs = [line.split("Depends:", 1)[1].strip() for line in
                 _run(["apt-cache", "depends", KERNEL_PACKAGE]).splitlines()
                 if line.strip().startswith("Depends:") and "linux-image-" in line]
        if not kpkgs:
            raise GuestBuildError(f"{KERNEL_PACKAGE} names no linux-image package "
                                  f"(run `apt-get update`?)")
        names = _dep_closure(GUEST_PACKAGES, log)
        log(f"  {len(names)} user-space packages + {kpkgs[0]}")
        debs = _download(names + [kpkgs[0]], debs_dir, log)
        for deb in debs[:-1]:
            _run(["dpkg-deb", "-x", str(deb), str(groot)])
        _run(["dpkg-deb", "-x", str(debs[-1]), str(kroot)])
        kver = kpkgs[0][len("linux-image-"):]
        vmlinuz = kroot / "boot" / f"vmlinuz-{kver}"
        if not vmlinuz.is_file():
            raise GuestBuildError(f"{vmlinuz.name} missing from {debs[-1].name}")
        modules = _module_files(kroot, kver, GUEST_MODULES)
        for rel in _PRUNE:
            shutil.rmtree(groot / rel, ignore_errors=True)
        for name, path in _guest_files():
            dst = groot / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dst)
            dst.chmod(0o755 if name == "init" else 0o644)
        mdir = groot / "opt" / "rxe" / "modules"
        mdir.mkdir(parents=True, exist_ok=True)
        for i, (name, raw) in enumerate(modules):
            (mdir / f"{i:02d}-{name}.ko").write_bytes(raw)
        for d in ("proc", "sys", "dev", "tmp", "run", "mnt"):
            (groot / d).mkdir(exist_ok=True)
        out.mkdir(parents=True, exist_ok=True)
        tmp_initrd = out / "initrd.cpio.tmp"
        with open(tmp_initrd, "wb") as f:
            cpio = _Cpio(f)
            cpio.add("dev", stat.S_IFDIR | 0o755)
            cpio.add("dev/console", stat.S_IFCHR | 0o600, rdev=(5, 1))
            cpio.add("dev/null", stat.S_IFCHR | 0o666, rdev=(1, 3))
            for d in sorted(os.listdir(groot)):
                p = groot / d
                if d == "dev":
                    continue
                if p.is_symlink():
                    cpio.add(d, stat.S_IFLNK | 0o777, os.readlink(p).encode())
                elif p.is_dir():
                    cpio.add(d, stat.S_IFDIR | 0o755)
                    _prefix_tree(cpio, p, d)
                else:
                    cpio.add(d, stat.S_IFREG | (p.stat().st_mode & 0o7777), p.read_bytes())
            cpio.close()
        shutil.copyfile(vmlinuz, out / "vmlinuz")
        tmp_initrd.replace(out / "initrd.cpio")
        info = {"key": key, "kernel": kver, "packages": [d.name for d in debs],
                "modules": [n for n, _ in modules],
                "initrd_bytes": (out / "initrd.cpio").stat().st_size,
                "build_seconds": round(time.monotonic() - t0, 1)}
        info_path.write_text(json.dumps(info, indent=1) + "\n")
        for old in build_dir.iterdir():      # images of earlier inputs are not needed again
            if old != out and re.fullmatch(r"[0-9a-f]{16}", old.name) and old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
        log(f"  done in {info['build_seconds']} s: kernel {kver}, "
            f"initramfs {info['initrd_bytes'] / 1e6:.0f} MB, {len(modules)} modules")
        return GuestImage(out / "vmlinuz", out / "initrd.cpio", key, info)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _prefix_tree(cpio, path, prefix):
    """Add the tree under ``path`` to ``cpio`` with names starting ``prefix/``."""
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames.sort()
        rel = os.path.join(prefix, os.path.relpath(dirpath, path))
        for d in list(dirnames):
            p = os.path.join(dirpath, d)
            name = os.path.normpath(os.path.join(rel, d))
            if os.path.islink(p):
                cpio.add(name, stat.S_IFLNK | 0o777, os.readlink(p).encode())
                dirnames.remove(d)
            else:
                cpio.add(name, stat.S_IFDIR | 0o755)
        for fn in sorted(filenames):
            p = os.path.join(dirpath, fn)
            name = os.path.normpath(os.path.join(rel, fn))
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                cpio.add(name, stat.S_IFLNK | 0o777, os.readlink(p).encode())
            elif stat.S_ISREG(st.st_mode):
                with open(p, "rb") as fh:
                    cpio.add(name, stat.S_IFREG | (st.st_mode & 0o7777), fh.read())
