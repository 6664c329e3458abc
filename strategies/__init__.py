"""Server side: per-cluster hard update, masses, reply validation, Flower strategies."""
