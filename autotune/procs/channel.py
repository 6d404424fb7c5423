"""The one message format between autotune and its child processes: JSON objects, never pickles.

* a command: ``{"op": NAME, "args": {...}}``;
* a reply: ``{"ok": VALUE}`` or ``{"error": {"type", "message", "out_of_memory", "traceback"}}``;
  before its reply a child may send any number of ``{"progress": {...}}``.

Framing: one message per line on a byte stream (the rank session's sockets), one message per
``send_bytes`` on a pipe (the study's measuring child). JSON keeps a child from ever running
code the parent did not send, and a rank's reply readable in its log.
"""

from __future__ import annotations

import json
import traceback
from typing import Any

from autotune.measurement.oom import is_out_of_memory

__all__ = ["command", "decode", "encode", "error_reply"]


def encode(message: dict[str, Any]) -> bytes:
    """One message as one line of UTF-8 JSON."""
    return json.dumps(message).encode() + b"\n"


def decode(data: bytes) -> dict[str, Any]:
    message = json.loads(data)
    assert isinstance(message, dict), message
    return message


def command(op: str, **args: Any) -> dict[str, Any]:
    return {"op": op, "args": args}


def error_reply(e: BaseException) -> dict[str, Any]:
    """The reply for an exception raised by a command (call it inside the ``except`` block)."""
    return {
        "error": {
            "type": type(e).__name__,
            "message": str(e),
            "out_of_memory": is_out_of_memory(e),
            "traceback": traceback.format_exc(),
        }
    }
