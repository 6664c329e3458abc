"""digits_cnn: a Flower app (own torch CNN, data and training loop) with fedroute's clustered routing."""
