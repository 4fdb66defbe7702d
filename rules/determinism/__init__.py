"""DET: seeds and deterministic algorithms (checklist C1, C6)."""
