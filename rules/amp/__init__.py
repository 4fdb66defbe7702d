"""AMP: mixed precision and loss scaling (checklist C2, C4)."""
