"""The agent stream: the service every node connects to, its handshake, inbox and wire reader."""
