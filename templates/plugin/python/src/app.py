"""The {{name}} plugin for Inlet (contract {{contract}}), built into a WebAssembly
component by componentize-py (see README.md and build.sh).

It reads `{"id": "...", "key": "...", ...}`, delivers the payload as JSON to
`POST /events` on the route's target, and classifies the answer: 2xx done; 408, 429
and 5xx retry (after `Retry-After` when given); any other answer parks the entry for
a person. Replace each method's body with what your event and target need, then add a
sample under `samples/` and run `./test.sh --update` to record it.

A WIT `result` error is returned by raising `componentize_py_types.Err(value)`; any
other exception traps, and Inlet reports it as a plugin fault with the traceback.
"""

import json

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports.types import (
    DecodeError,
    Decoded_Event,
    Disposition_Done,
    Disposition_Park,
    Disposition_Retry,
    Event,
    Outcome_TransportError,
    Request,
)


class Handler(exports.Handler):
    def decode(self, msg):
        """Runs before the broker is acked: read the payload and pick the keys. An
        error parks the message with its raw bytes for a person."""
        try:
            doc = json.loads(bytes(msg.data).decode("utf-8"))
        except ValueError as e:  # a JSONDecodeError or a UnicodeDecodeError
            raise Err(DecodeError(message=f"cannot read the event: {e}"))
        if not isinstance(doc, dict):
            raise Err(DecodeError(message="cannot read the event: not a JSON object"))
        for field in ("id", "key"):
            if not isinstance(doc.get(field), str):
                raise Err(DecodeError(message=f"cannot read the event: `{field}` is missing or not a string"))
        if not doc["key"]:
            raise Err(DecodeError(message="the event has an empty key"))
        return Decoded_Event(
            Event(
                event_type="{{name}}",
                correlation_key=doc["key"],
                dedup_key=doc["id"],
                # What `render` gets later: the payload as it came.
                body=msg.data,
                schema_version=None,
            )
        )

    def render(self, ev):
        """Shapes the request. The host adds the target's base URL, its configured
        headers, the `Idempotency-Key` (the dedup key) and the timeout."""
        return Request(
            method="POST",
            path="/events",
            headers=[("content-type", "application/json")],
            body=ev.body,
        )

    def classify(self, ev, exchange, outcome):
        """Says what the answer means. Technical trouble: retry. A refusal that
        retrying cannot fix: park."""
        if isinstance(outcome, Outcome_TransportError):
            return Disposition_Retry(None)
        response = outcome.value
        status = response.status
        if 200 <= status <= 299:
            return Disposition_Done()
        if status in (408, 429) or 500 <= status <= 599:
            return Disposition_Retry(retry_after_ms(response.headers))
        text = bytes(response.body[:300]).decode("utf-8", "replace")
        return Disposition_Park(f"target answered {status}: {text}")


def retry_after_ms(headers):
    """A `Retry-After` header in whole seconds, as milliseconds."""
    for name, value in headers:
        if name.lower() == "retry-after":
            value = value.strip()
            return int(value) * 1000 if value.isascii() and value.isdigit() else None
    return None
