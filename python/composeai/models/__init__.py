"""Model adapters, the model protocol, resolution of model strings and prices."""
