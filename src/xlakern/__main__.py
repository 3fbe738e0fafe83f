"""``python -m xlakern``: ``doctor`` (what xlakern sees) and ``cache list`` / ``cache clear [NAME]``.

Example::

    python -m xlakern doctor
    python -m xlakern cache list
    python -m xlakern cache clear my_kernels
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from . import _cache, _diagnostics
from ._numba_cpu import _configure_threading
from ._version import __version__


def _doctor(args: argparse.Namespace) -> int:
    with contextlib.suppress(Exception):  # start Numba's threads as xlakern would, to report the layer
        _configure_threading()
    _diagnostics.print_diagnostics(command_line=True)
    return 0


def _tree_size(directory: Path) -> int:
    """Bytes of the files under ``directory`` (one cached build)."""
    total = 0
    for f in directory.rglob("*"):
        with contextlib.suppress(OSError):
            if f.is_file():
                total += f.stat().st_size
    return total


def _cache_list(args: argparse.Namespace) -> int:
    root = _cache.cache_root()
    print(f"cache dir: {root}")
    names = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    rows = []
    for d in names:
        builds = [k for k in d.iterdir() if k.is_dir() and not k.name.startswith(".")]
        if builds:
            rows.append((d.name, len(builds), sum(_tree_size(k) for k in builds)))
    if not rows:
        print("no builds cached")
        return 0
    width = max(len(n) for n, _, _ in rows)
    print(f"{'name':<{width}}  builds  size")
    for name, count, size in rows:
        print(f"{name:<{width}}  {count:>6}  {size / 1e6:.1f} MB")
    print("(numba-cpu / numba-cuda: compiled Numba kernels; every other name is a module)")
    return 0


def _cache_clear(args: argparse.Namespace) -> int:
    root = _cache.cache_root()
    if args.name is not None and not (root / args.name).is_dir():
        print(f"no builds of '{args.name}' in {root}; `python -m xlakern cache list` shows what is cached",
              file=sys.stderr)
        return 1
    result = _cache.clear(root, args.name)
    what = f"'{args.name}'" if args.name else "everything"
    print(f"removed {len(result['removed'])} build(s) of {what} from {root}")
    for path in result["skipped"]:
        print(f"skipped {path}: a build is in progress there", file=sys.stderr)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m xlakern",
        description="Diagnostics and build-cache tools of xlakern. With no command: doctor.")
    parser.add_argument("--version", action="version", version=f"xlakern {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    doctor = commands.add_parser("doctor", help="print versions, toolchain, driver, GPUs and the cache",
                                 description="Print what xlakern sees on this machine.")
    doctor.set_defaults(run=_doctor)
    cache = commands.add_parser("cache", help="list or clear the build cache",
                                description="The build cache ($XLAKERN_CACHE_DIR or ~/.cache/xlakern).")
    actions = cache.add_subparsers(dest="action", metavar="ACTION", required=True)
    actions.add_parser("list", help="cached builds per module name, with sizes").set_defaults(run=_cache_list)
    clear = actions.add_parser("clear", help="delete cached builds (of NAME, or all); builds in progress stay")
    clear.add_argument("name", nargs="?", help="module name (or numba-cpu / numba-cuda); default: all")
    clear.set_defaults(run=_cache_clear)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (argparse exits 0 for ``--help``, 2 for misuse)."""
    args = _parser().parse_args(argv)
    if args.command is None:
        return _doctor(args)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
