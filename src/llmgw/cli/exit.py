"""Exit codes scripts can rely on."""

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
# sysexits.h's EX_CONFIG: the configuration is wrong, retrying will not help.
EXIT_CONFIG = 78
# 128 + SIGINT, what a shell reports for an interrupted program.
EXIT_FORCED = 130
