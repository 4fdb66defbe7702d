"""The pair engine below the commands: `verify ORIGINAL [PORTED]` and `verify determinism` run and judge through it;
the CLI (verify/cli/pair.py, verify/cli/determinism.py) parses their command lines and prints.

- `plan.py`: what a pair will run (`PairPlan`), its options checked and its folder claimed, and what the scripts'
  text decides: whether the port runs at once with its reference, whether that reference follows its precision;
- `sides.py`: each side run under one progress display, one at a time or several at once (`SideRunner`);
- `run.py`: the pair's runs in their order (`run_sides`: the port, the reference, its calibration runs, its fp32 run);
- `judge.py`: their comparison (`compare_pair`), as `verify compare` makes it, and its reports;
- `determinism.py`: one script run twice and compared exactly.

Each side is a `verify run` (verify/launch/runner.py) and the comparison is `verify compare`'s (verify/compare/runs.py,
verify/report/writers.py): the pair decides what to run, runs it, and adds what it knows to the reports: how the
precision of the two sides was matched, and the AMP effect when asked.

Mixed precision on one side only: `migrate` usually gives the port an fp16 autocast that the original lacks. When
the port's forward computes in fp16/bf16, the reference computes under the same autocast where the port does, module
call by module call (verify/capture/precision_scopes.py; on the CPU with the emulated NPU's op casts), so the comparison
isolates the port; a reference that still cannot run so runs as written, judged fp32 against AMP. A port that starts
no ranks runs at once with its reference and calibration runs, which follow its autocast and GradScaler as the port
writes them (verify/capture/followed_port.py); where that was not what they would have run after the port (the port
computed in half precision without autocast, an original with its own autocast), they run again after it.
`--amp-effect` also runs the reference in fp32 and compares it with the reference under autocast: the AMP effect
alone, judged with the documented fp32-vs-AMP tolerances (verify/compare/tolerances.py). `--no-match-amp` compares
fp32 with AMP directly, with the same wider tolerances.
"""
