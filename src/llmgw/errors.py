"""The few domain errors. Only cli/ turns them into exit codes."""

from __future__ import annotations


class LlmgwError(Exception):
    """An error whose message is written for the person running llmgw."""


class ConfigError(LlmgwError):
    """A configuration file that cannot be used; the message names file, line and key."""


class CertificateError(LlmgwError):
    """A certificate or key that is missing, unreadable or not what was expected."""


class StoreError(LlmgwError):
    """The store could not be opened or migrated."""
