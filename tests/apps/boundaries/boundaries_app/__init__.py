"""A user's Flower app on fedroute's public API (the plugin case of issue 10)."""
