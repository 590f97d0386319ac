# SPDX-License-Identifier: BSD-2-Clause
"""``python -m sim.guest build [--force] [--dir DIR]``: build the soft-RoCE guest image (cached);
``python -m sim.guest key``: print the cache key of the current inputs;
``python -m sim.guest layer``: list the repository files the guest gets at boot (the layer of
:data:`sim.guest.GUEST_PYTHON`) and their hash."""

import argparse
import sys

from .builder import (DEFAULT_BUILD_DIR, GUEST_PYTHON, PYLIB, GuestBuildError, build_image,
                      find_qemu, image_key, write_python_layer)

__all__ = ["main"]


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m sim.guest",
                                 description="Build the Linux soft-RoCE (rdma_rxe) guest image "
                                             "from Debian packages fetched with apt-get.")
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build the image, or reuse the cached one if its inputs "
                                     "did not change")
    b.add_argument("--force", action="store_true", help="rebuild even if cached")
    b.add_argument("--dir", default=str(DEFAULT_BUILD_DIR),
                   help="cache directory (default: %(default)s)")
    sub.add_parser("key", help="print the hash of the image inputs")
    sub.add_parser("layer", help="list the repository files appended to the image at boot")
    args = ap.parse_args(argv)
    if args.command == "key":
        print(image_key())
        return 0
    if args.command == "layer":
        import tempfile
        try:
            with tempfile.TemporaryDirectory() as d:
                key, files = write_python_layer(f"{d}/layer.cpio", GUEST_PYTHON)
        except GuestBuildError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"layer {key}: {len(files)} files of {', '.join(GUEST_PYTHON)} under {PYLIB}")
        for f in files:
            print(f"  {f}")
        return 0
    try:
        find_qemu()           # an image nobody can boot helps no one: say so first
        img = build_image(args.dir, force=args.force)
    except GuestBuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"kernel {img.kernel}\ninitrd {img.initrd}\nkey {img.key} "
          f"({img.info['kernel']}, {img.info['initrd_bytes'] / 1e6:.0f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
