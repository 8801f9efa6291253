"""What a name may be, where a person's name for a thing becomes a path, a URL or a command line.

A model named `../../../escape` once made every node write its engine's log
outside its state directory, `llmgw cert issue-server ../x` wrote the
certificate and its key elsewhere than asked, and a model named `--help` would
be read by its engine as an option. So the names a person chooses (models,
profiles, nodes, certificates, keys) are checked where they come in, with a
sentence saying what is allowed; and where a name still has to become a file
name (a shard's log), it is encoded, so that even a name from an older control
plane cannot leave its directory.

Model names may hold `/` between parts: clients ask for Hugging Face's
`org/model` names. Everything that puts one in a URL path encodes it as one
segment (`org%2Fmodel`).
"""

from __future__ import annotations

import re
import urllib.parse

MAX_MODEL_NAME = 128
# A DNS label's length: node ids are usually host names.
MAX_NODE_ID = 63
MAX_PROFILE_NAME = 64
# An organisation's, team's or project's name: a line on a page, in a listing, in a refusal.
MAX_SCOPE_NAME = 100
# Ids are SQLite integers: 18 digits always fit in 64 bits, so no id a person types overflows the store.
ID_PATTERN = "[0-9]{1,18}"
_ID = re.compile(ID_PATTERN)

# A part starts with a letter or digit: no "." or ".." (a path's parent), no leading "-" (an option
# to the engine it is passed to), no empty part (a "//" or a leading or trailing "/").
_PART = r"[A-Za-z0-9][A-Za-z0-9._:-]*"
_MODEL = re.compile(rf"{_PART}(/{_PART})*")
# A model's name as a JSON Schema pattern, for the admin API's document (anchored: JSON Schema's
# patterns match anywhere).
MODEL_PATTERN = rf"^{_PART}(/{_PART})*$"
_PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")

MODEL_RULE = (
    "letters, digits and . _ - :, in parts separated by single '/' (org/model), each part starting "
    f"with a letter or digit, at most {MAX_MODEL_NAME} characters"
)
PLAIN_RULE = "letters, digits and . _ -, starting with a letter or digit"


def model_name_problem(name: str) -> str | None:
    """What is wrong with name as a model's name, in a sentence; None when nothing is."""
    if len(name) > MAX_MODEL_NAME or not _MODEL.fullmatch(name):
        return f"the model name {name!r} is not allowed; a model name is {MODEL_RULE}"
    return None


def node_id_problem(node: str) -> str | None:
    """What is wrong with node as a node id (a certificate's common name, a file name), or None."""
    if len(node) > MAX_NODE_ID or not _PLAIN.fullmatch(node):
        return (
            f"the node id {node!r} is not allowed; a node id is {PLAIN_RULE}, "
            f"at most {MAX_NODE_ID} characters (a host name such as gpu-01.example)"
        )
    return None


def file_stem_problem(name: str, what: str) -> str | None:
    """What is wrong with name as the stem of files written for it (NAME.pem), or None."""
    if len(name) > MAX_NODE_ID or not _PLAIN.fullmatch(name):
        return (
            f"the {what} {name!r} is not allowed; it becomes a file name, so it is {PLAIN_RULE}, "
            f"at most {MAX_NODE_ID} characters"
        )
    return None


def profile_name_problem(name: str) -> str | None:
    """What is wrong with name as a profile's name, or None."""
    if len(name) > MAX_PROFILE_NAME or not _PLAIN.fullmatch(name):
        return (
            f"the profile name {name!r} is not allowed; a profile name is {PLAIN_RULE}, "
            f"at most {MAX_PROFILE_NAME} characters"
        )
    return None


def key_name_problem(name: str) -> str | None:
    """What is wrong with name as an API key's name (shown in listings, pages and refusals), or None."""
    if not name.strip():
        return "a key needs a name, so that a person can tell what it is for"
    if len(name) > 100 or any(not ch.isprintable() for ch in name):
        return (
            f"the key name {name!r} is not allowed; a key name is printable characters "
            "(no line breaks or tabs), at most 100 of them"
        )
    return None


def scope_name_problem(name: str, what: str) -> str | None:
    """What is wrong with name as an organisation's, team's or project's name, or None.

    A control character (U+0018 was stored once) is invisible on a page and garbles a terminal
    that prints a listing.
    """
    if not name.strip(" "):
        return f"a {what} needs a name"
    if len(name) > MAX_SCOPE_NAME or _CONTROL_CHARACTER.search(name):
        return (
            f"the {what} name {name!r} is not allowed; a name is at most {MAX_SCOPE_NAME} characters, "
            "with no line breaks, tabs or other control characters"
        )
    return None


# What a scope's name may not hold: control characters (C0, DEL, C1) and the line and paragraph
# separators. The same class is the admin API document's pattern (SCOPE_NAME_PATTERN), so that the
# document and the server agree on every name. str.isprintable() was the rule before, and no short
# pattern says it (Python's re, which makes the fuzzer's examples, has no \p{...}): the document
# allowed names the server refused.
_CONTROL = "\\u0000-\\u001f\\u007f-\\u009f\\u2028\\u2029"
_CONTROL_CHARACTER = re.compile(f"[{_CONTROL}]")
# A scope's name as scope_name_problem allows it, as a JSON Schema pattern: no control characters,
# not only spaces (maxLength: MAX_SCOPE_NAME says how many).
SCOPE_NAME_PATTERN = f"^ *[^ {_CONTROL}][^{_CONTROL}]*$"


def id_number(text: str) -> int | None:
    """text as an id when it is one written in ASCII digits, else None.

    str.isdigit() is true for "³" and "٣", which int() then refuses (or reads, for Arabic-Indic
    digits): a scope named "³" was a 500. Long runs of digits are names too, never an id the store
    could not hold.
    """
    return int(text) if _ID.fullmatch(text) else None


def shard_stem(model: str) -> str:
    """The readable start of a shard id for model: its name with '/' as '--' (org--model)."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", model.replace("/", "--"))


def file_name(text: str) -> str:
    """text as one file name, whatever it holds: percent-encoded, so that no '/' or '..' survives."""
    encoded = urllib.parse.quote(text, safe="")
    # Dots stay as they are in quote(); a name of dots only would be "." or ".." itself.
    if not encoded.strip("."):
        encoded = encoded.replace(".", "%2E")
    return encoded or "_"


def url_segment(name: str) -> str:
    """name as one segment of a URL path: org/model becomes org%2Fmodel."""
    return urllib.parse.quote(name, safe="")
