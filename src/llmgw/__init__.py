"""llmgw: self-hosted LLM serving for a fleet of machines."""

__version__ = "0.1.0"
