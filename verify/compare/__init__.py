"""Comparing two runs: the ops aligned, the metrics and tolerances, each op's verdict and the first divergent op, the
losses, gradients and hyperparameters, the ranks, the findings and the verdict (`runs.compare_runs` puts it together).
Never imports torch."""
