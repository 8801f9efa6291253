"""APIs an engine does not speak, said in chat completions' terms: Anthropic's Messages, OpenAI's Responses.

Pure data in, data out: the gateway reads the request, asks the translation for the chat body,
sends it, and gives each chat reply or stream event back to the translation for the client.
"""

from llmgw.translate.chat import TranslationError, UpstreamError

__all__ = ["TranslationError", "UpstreamError"]
