"""``python -m xlakern doctor``: print what xlakern sees on this machine."""

import sys

from ._diagnostics import print_diagnostics


def main(argv: list[str]) -> int:
    if argv[:1] in ([], ["doctor"]):
        print_diagnostics()
        return 0
    print("usage: python -m xlakern doctor", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
