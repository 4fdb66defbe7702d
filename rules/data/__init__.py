"""DATA: data order, shuffling and sharding (checklist C6, C7)."""
