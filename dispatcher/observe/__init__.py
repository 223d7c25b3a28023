"""What the service says about itself: logs, metrics, traces."""
