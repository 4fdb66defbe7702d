"""`verify` as a command (`python -m verify`, and the `verify` script): the CLI, or, where npu-port's dependencies are
not installed for this interpreter, one line and exit 2. An ImportError would otherwise print a traceback and exit 1,
the code for FAIL."""

from __future__ import annotations

import sys

from verify.schema import EXIT_ERROR


def main() -> None:
    try:
        from verify.cli import main as run_cli
    except ModuleNotFoundError as missing:
        print(f"verify: error: {missing.name} is not installed for {sys.executable}: install npu-port with its "
              "dependencies (pip install -e . in its folder)", file=sys.stderr)
        raise SystemExit(EXIT_ERROR) from None
    run_cli()


if __name__ == "__main__":
    main()
