"""The machinery behind the rules: the rule base class and its examples, settings and findings, the shared tree
index, name resolution, positions and the helpers rules share. Rules and the engine import none of it from here:
`rules` (rules/__init__.py) is their one public module, and re-exports what they may rely on."""
