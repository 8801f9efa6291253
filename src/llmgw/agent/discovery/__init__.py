"""What the agent finds out about its machine."""
