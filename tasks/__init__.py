"""Learning tasks: each task's client data, model, loss and local update."""
