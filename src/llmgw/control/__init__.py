"""The control plane: fleet state and scheduling (inventory, placement, reconciliation), its stream and HA."""
