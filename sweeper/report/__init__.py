"""What a run did, for an operator: the console read-back, the notebook's figures, metrics, progress."""
