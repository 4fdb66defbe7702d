"""The rules' one door to verify/frameworks, what the project knows of each framework (Trainer, accelerate, Lightning,
torch.compile, ...), shared with migrate and verify and made of the standard library alone: a rule reads it as
`rules.frameworks` (`frameworks.lightning.TRAINERS`, `frameworks.own_amp(code)`); tests/test_layering.py lets this
module, and no other of the rules, import it."""

from __future__ import annotations

import verify.frameworks as frameworks

__all__ = ["frameworks"]
