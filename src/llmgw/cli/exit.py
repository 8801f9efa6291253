"""Exit codes scripts can rely on."""

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
# `llmgw ctl`: the server could not be reached at all; retrying later may help.
EXIT_UNREACHABLE = 3
# `llmgw ctl`: the node, model or log source asked about does not exist.
EXIT_NOT_FOUND = 4
# `llmgw ctl`: the server refused the admin token (or none was given where one is needed).
EXIT_DENIED = 5
# `llmgw store migrate --check`: the store lacks migrations (what they do is printed).
EXIT_PENDING = 10
# sysexits.h's EX_CONFIG: the configuration is wrong, retrying will not help.
EXIT_CONFIG = 78
# 128 + SIGINT, what a shell reports for an interrupted program.
EXIT_FORCED = 130
