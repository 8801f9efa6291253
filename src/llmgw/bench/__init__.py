"""`llmgw ctl bench`: what a model serves at each concurrency, measured through the gateway."""
