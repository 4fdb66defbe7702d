"""The run folder: its format (`schema`, with the statistics of a tensor in `statistics`), its layout and claims
(`run_folders`), writing and reading it (`store`), the environment a run records (`environment`) and msprobe dumps
read into the same type. Never imports torch, so two run folders can be compared and reported on any laptop."""
