"""What the service reads from files that change while it runs: the bearer token, the TLS files."""
