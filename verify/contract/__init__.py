"""What `migrate` and `verify` agree on, the one part of verify that migrate imports: standard library only, so that
either reads the other's files without loading the other (verify never imports migrate, the rules or libcst; migrate
never loads torch or pandas).

- `files.py`: the port's name, and the name of every file either tool writes for the other or for a person: migrate's
  report folder (`<port stem>_report/`) and fix folder, verify's report files and the run's manifest.json.
- `checklist_items.py`: the accuracy checklist's items and statuses, and the Markdown escaping both tools' reports use.
- `finding_codes.py`: verify's finding codes (`FindingCode`), which summary.json names and migrate's fix acts on.
- `pair_result.py`: typed readers of what a pair found (summary.json) and ran (manifest.json), for `migrate --fix-from`.
"""
