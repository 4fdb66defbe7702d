"""`migrate` as a command (`python -m migrate`, and the `migrate` script)."""

from migrate import collector


def main() -> None:
    collector.pause_for_startup()  # before the CLI's own modules load (typer, rich), not only the rules and libcst
    from migrate.cli import main as run_cli

    run_cli()


if __name__ == "__main__":
    main()
