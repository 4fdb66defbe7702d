"""`python -m verify.cli`: the same command as `python -m verify`."""

from verify.cli import main

if __name__ == "__main__":
    main()
