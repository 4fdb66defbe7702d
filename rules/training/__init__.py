"""TRN: the training process and its hyperparameters (checklist C8, C9)."""
