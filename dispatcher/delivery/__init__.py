"""What happens to a message: the handler that decides, and the policies it applies."""
