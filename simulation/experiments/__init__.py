"""Paper experiments; importing this package registers their ``fedroute reproduce`` commands."""
