"""What a comparison is shown as: the terminal summary, summary.json, advice.txt, report.html, ops.xlsx, ops.csv and
ops.parquet (`writers.write_reports`), the adaptation report, and the advice. Never imports torch."""
