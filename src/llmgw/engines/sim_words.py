"""What the sim engine's server and its adapter agree on, apart from the server itself.

The adapter is read by every command that loads the engine registry (config checks
included); the server pulls in aiohttp and prometheus_client, which `llmgw keys --help`
has no use for.
"""

# The secret the sim requires of callers, when set: the gateway's replica secret (engines/sim.py sets it).
API_KEY_ENV = "LLMGW_ENGINE_API_KEY"

# What /metrics calls its requests being answered and the tokens it has produced.
IN_FLIGHT_METRIC = "llmgw_sim_requests_in_flight"
COMPLETION_TOKENS_METRIC = "llmgw_sim_completion_tokens_total"
