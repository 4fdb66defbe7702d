"""`verify` as a command (`python -m verify`, and the `verify` script): the CLI (verify/cli/, which also says, on
one line and with exit 2, when npu-port's dependencies are not installed for this interpreter)."""

from verify.cli import main

if __name__ == "__main__":
    main()
