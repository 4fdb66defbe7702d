"""Starting a run: the child process (or torch's launcher and its ranks), its environment, the timeout, and the
run's manifest composed from its ranks. Runs in verify's own process; never imports torch."""
