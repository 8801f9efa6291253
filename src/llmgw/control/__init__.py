"""The control plane: the agent service, the inventory, placement and reconciliation."""

# How a standby's refusal of an agent starts (control/leadership.py says the rest: who leads, where).
# The agent recognises it and moves on to its next server at once.
STANDBY = "this control plane is a standby"
