"""A TCP port free on this machine, for a process group's rendezvous in a test's child process."""

import socket


def free_port() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])
