"""The shared dedupe store every replica uses (Redis)."""
