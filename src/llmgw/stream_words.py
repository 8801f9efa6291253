"""Words both ends of the agent stream need: the agent reads what the control plane says with them.

They live below both sides, so the agent never imports the control plane to recognise a refusal.
"""

# How a standby's refusal of an agent starts (control/ha/leadership.py says the rest: who leads, where).
# The agent recognises it and moves on to its next server at once.
STANDBY = "this control plane is a standby"

# What every refusal of an agent for its version says (llmgw/versions.py): the agent recognises it
# and waits its longest between rounds, since only an upgrade, not a retry, lets it in.
VERSION_WINDOW = "than this server accepts"
