"""Setting a machine up to run llmgw: `llmgw server init` and the files it installs.

The steps work on a root directory (`/` on a real machine) and reach the
operating system only through `system.System`, so the tests run them against a
temporary root without creating users or starting services.
"""
