"""Work-order plugin, in Python: the twin of `plugins/work-order` (Rust), built into a
component by componentize-py (see README.md and `scripts/build-plugins`).

`work-order-completed` events from the maintenance system, correlated into a Camunda 7
process waiting in a message catch event.

Payload: `{"workOrderId":"4711","completedItems":3,"completionTimestamp":"2026-08-01T10:00:00Z"}`
(optionally with `"eventId"`, or an `eventId` attribute, as the business dedup key).

Behaviour is the Rust plugin's, decision for decision: the same payloads are accepted
and refused, the same event, request and dispositions come out, byte for byte. Only
the text of a parse error differs (Python's wording instead of serde's). To get there
the JSON reading below follows serde_json + `#[derive(Deserialize)]` rather than
Python's looser defaults: no NaN/Infinity, integers only where the Rust type is an
integer (`3.0`, `-0`, `true` are refused), duplicate known fields refused, known
strings must be valid Unicode, unknown fields are skipped unchecked (invalid UTF-8 and
any depth of nesting included), and a struct may also be written as a JSON array of its
fields in order (as serde allows). `tests/second_language.rs` holds the two twins to
this, call for call.
"""

import json
import re

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports.types import (
    DecodeError,
    Decoded_Event,
    Disposition_Done,
    Disposition_NotYet,
    Disposition_Park,
    Disposition_Retry,
    Event,
    Outcome_TransportError,
    Request,
)

MESSAGE_NAME = "WorkOrderCompleted"

# (name, kind, required), in declaration order: serde reads a struct from a JSON array
# in this order, and serializes it in this order.
WORK_ORDER_FIELDS = (
    ("workOrderId", "string", True),
    ("completedItems", "u32", True),
    ("completionTimestamp", "string", True),
    ("eventId", "option<string>", False),
)
REST_EXCEPTION_FIELDS = (("message", "string", True),)

# Rust's `char::is_whitespace` (Unicode White_Space), used by `str::trim`. Python's
# `str.strip()` would also strip U+001C..U+001F, which Rust keeps.
RUST_WHITESPACE = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
    "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
U64_MAX = (1 << 64) - 1


class Handler(exports.Handler):
    def decode(self, msg):
        try:
            order = parse_struct(msg.data, WORK_ORDER_FIELDS)
        except (ValueError, RecursionError) as e:  # json.JSONDecodeError is a ValueError
            raise Err(DecodeError(message=f"payload is not a work-order-completed event: {e}"))
        if not order["workOrderId"].strip(RUST_WHITESPACE):
            raise Err(DecodeError(message="workOrderId is empty"))
        dedup_key = next((v for k, v in msg.attributes if k == "eventId"), None)
        if dedup_key is None:
            dedup_key = order["eventId"]
        return Decoded_Event(
            Event(
                event_type="work-order-completed",
                correlation_key=order["workOrderId"],
                dedup_key=dedup_key,
                body=serialize_order(order),
                schema_version="1",
            )
        )

    def render(self, ev):
        try:
            order = parse_struct(ev.body, WORK_ORDER_FIELDS)
        except (ValueError, RecursionError) as e:
            raise Err(f"stored body is not a work order: {e}")
        body = {
            "messageName": MESSAGE_NAME,
            "correlationKeys": {
                "workOrderId": {"value": order["workOrderId"], "type": "String"},
            },
            "processVariables": {
                "completedItems": {"value": order["completedItems"], "type": "Integer"},
                "completionTimestamp": {"value": order["completionTimestamp"], "type": "String"},
            },
            "resultEnabled": False,
        }
        return Request(
            method="POST",
            path="/engine-rest/message",
            headers=[("content-type", "application/json")],
            # serde_json's `json!` builds a BTreeMap: keys come out sorted.
            body=to_json(body, sort_keys=True),
        )

    def classify(self, ev, exchange, outcome):
        if isinstance(outcome, Outcome_TransportError):
            # Timeout, connect and other alike.
            return Disposition_Retry(None)
        response = outcome.value
        status = response.status
        if 200 <= status <= 299:
            return Disposition_Done()
        if status == 400:
            message = rest_exception_message(response.body)
            if "No process definition or execution matches" in message:
                # The process has not reached the catch event yet, or already left it.
                return Disposition_NotYet(message)
            if "executions match" in message or "to a single execution" in message:
                # More than one waiting instance: retrying can never pick one.
                return Disposition_Park(message)
            return Disposition_Park(f"camunda refused the message: {message}")
        if status == 429:
            return Disposition_Retry(retry_after_ms(response.headers))
        if 401 <= status <= 499:
            return Disposition_Park(f"camunda answered {status}: {rest_exception_message(response.body)}")
        return Disposition_Retry(retry_after_ms(response.headers))


def rest_exception_message(body):
    """Camunda 7 answers errors as `{"type":"RestException","message":"..."}`; anything
    else is shown as its first 512 bytes, invalid UTF-8 replaced (as Rust's
    `String::from_utf8_lossy`, which replaces the same maximal subparts)."""
    try:
        return parse_struct(body, REST_EXCEPTION_FIELDS)["message"]
    except (ValueError, RecursionError):
        return bytes(body[:512]).decode("utf-8", "replace")


def retry_after_ms(headers):
    """The first `Retry-After` header (ASCII case-insensitive) as whole seconds, in ms."""
    for name, value in headers:
        if name.isascii() and name.lower() == "retry-after":
            text = value.strip(RUST_WHITESPACE)
            digits = text[1:] if text.startswith("+") else text  # u64::from_str takes a `+`
            if not (digits.isascii() and digits.isdigit()) or len(digits.lstrip("0")) > 20:
                return None
            secs = int(digits)
            if secs > U64_MAX:
                return None
            # Saturates like the Rust twin's `saturating_mul`; the host caps it at the
            # route's largest delay anyway.
            return min(secs * 1000, U64_MAX)
    return None


# --- JSON, read and written the way serde_json does it -------------------------------


class Invalid(ValueError):
    pass


class Members(list):
    """A JSON object as its (key, value) members, in order, duplicates kept."""


class Number:
    """A JSON number no Rust integer field accepts: a fraction or exponent, `-0`
    (a float to serde_json), or more digits than a u64 has."""


NUMBER = Number()


def _int(text):
    if not text.isascii():  # the pure-Python scanner's `\d` matches any Unicode digit
        raise Invalid(f"invalid number {text!r}")
    if text == "-0" or len(text) > 21:
        return NUMBER
    return int(text)


def _float(text):
    if not text.isascii():
        raise Invalid(f"invalid number {text!r}")
    return NUMBER


def _constant(name):
    raise Invalid(f"{name} is not JSON")


# Above this many brackets a document may nest deeper than CPython's recursive JSON
# scanner can go on the wasm stack: CPython's own recursion guard measures the stack in
# linear memory, not wasmtime's, and 2,000 levels trap the call. serde_json skips
# unknown values at any depth, so such documents take the iterative path below.
RECURSIVE_PARSE_MAX_BRACKETS = 500


def parse_json(data):
    # Invalid UTF-8 becomes lone surrogates: refused outside strings by the parser and
    # in the fields we read by `_check`, but left alone inside skipped values, where
    # serde_json does not look either.
    text = bytes(data).decode("utf-8", "surrogateescape")
    if text.count("[") + text.count("{") > RECURSIVE_PARSE_MAX_BRACKETS:
        return parse_json_iteratively(text)
    return json.loads(text, object_pairs_hook=Members, parse_int=_int, parse_float=_float, parse_constant=_constant)


_WS = re.compile(r"[ \t\n\r]*")
_NUMBER = re.compile(r"(-?(?:0|[1-9][0-9]*))(\.[0-9]+)?([eE][-+]?[0-9]+)?")


def parse_json_iteratively(text):
    """What `json.loads` with our hooks accepts, with an explicit stack instead of
    recursion (strings go through json's own `scanstring`). It returns the top-level
    value with its members, but containers below them come back empty: all a struct
    needs is their type, and a deeply nested structure would take CPython's recursive
    deallocation past the wasm stack, as the recursive scanner would."""
    scanstring = json.decoder.scanstring
    ws = _WS.match
    stack = []  # open containers: [list, None] or [Members, key of the member being read]
    i = ws(text, 0).end()
    while True:
        # A value starts at i.
        ch = text[i : i + 1]
        if ch == '"':
            value, i = scanstring(text, i + 1, True)
        elif ch == "{" or ch == "[":
            i = ws(text, i + 1).end()
            closer = "}" if ch == "{" else "]"
            if text.startswith(closer, i):
                value, i = (Members() if ch == "{" else []), i + 1
            elif ch == "[":
                stack.append([[], None])
                continue
            else:
                key, i = _member_key(text, i)
                stack.append([Members(), key])
                continue
        elif text.startswith("null", i):
            value, i = None, i + 4
        elif text.startswith("true", i):
            value, i = True, i + 4
        elif text.startswith("false", i):
            value, i = False, i + 5
        else:
            m = _NUMBER.match(text, i)
            if m is None:
                raise Invalid(f"expected a value at char {i}")
            integer, fraction, exponent = m.groups()
            value = _float(m.group()) if fraction or exponent else _int(integer)
            i = m.end()
        # Put the value in its container; close every container that ends here.
        while True:
            i = ws(text, i).end()
            if not stack:
                if i != len(text):
                    raise Invalid(f"trailing characters at char {i}")
                return value
            container, key = top = stack[-1]
            if len(stack) == 1:
                container.append(value if key is None else (key, value))
            if text.startswith(",", i):
                i = ws(text, i + 1).end()
                if key is not None:
                    top[1], i = _member_key(text, i)
                break
            if text.startswith("]" if key is None else "}", i):
                stack.pop()
                value, i = container, i + 1
                continue
            raise Invalid(f"expected `,` or the end of a {'list' if key is None else 'map'} at char {i}")


def _member_key(text, i):
    """Reads `"key" :` at i; returns the key and where its value starts."""
    if not text.startswith('"', i):
        raise Invalid(f"expected a key at char {i}")
    key, i = json.decoder.scanstring(text, i + 1, True)
    i = _WS.match(text, i).end()
    if not text.startswith(":", i):
        raise Invalid(f"expected `:` at char {i}")
    return key, _WS.match(text, i + 1).end()


def _is_text(value):
    if type(value) is not str:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: invalid UTF-8 or a lone \\uD800 escape
        return False
    return True


def _check(name, kind, value):
    if kind == "string" and _is_text(value):
        return value
    if kind == "option<string>" and (value is None or _is_text(value)):
        return value
    if kind == "u32" and type(value) is int and 0 <= value <= 0xFFFFFFFF:
        return value
    raise Invalid(f"invalid value for `{name}`: expected {kind}, found {_describe(value)}")


def _describe(value):
    if value is None:
        return "null"
    if value is NUMBER:
        return "a number that is not a u32"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, str):
        return "a string" if _is_text(value) else "a string that is not valid Unicode"
    if isinstance(value, Members):
        return "a map"
    return "a sequence"


def parse_struct(data, fields):
    """Reads a struct as `serde_json::from_slice` with `#[derive(Deserialize)]` does:
    a JSON object (unknown members skipped, a known one twice refused, missing optional
    fields None) or a JSON array of the fields in order. Raises ValueError."""
    doc = parse_json(data)
    values = {}
    if isinstance(doc, Members):
        kinds = {name: kind for name, kind, _ in fields}
        for key, value in doc:
            if not _is_text(key):
                raise Invalid("a key is not valid Unicode")
            if key in kinds:
                if key in values:
                    raise Invalid(f"duplicate field `{key}`")
                values[key] = _check(key, kinds[key], value)
    elif isinstance(doc, list):
        if len(doc) > len(fields):
            raise Invalid(f"invalid length {len(doc)}, expected at most {len(fields)} elements")
        for (name, kind, required), value in zip(fields, doc):
            values[name] = _check(name, kind, value)
        for name, kind, required in fields[len(doc):]:
            if required:
                raise Invalid(f"invalid length {len(doc)}, expected {len(fields)} elements")
    else:
        raise Invalid(f"invalid type: {_describe(doc)}, expected a struct")
    for name, kind, required in fields:
        if name not in values:
            if required:
                raise Invalid(f"missing field `{name}`")
            values[name] = None
    return values


def serialize_order(order):
    """The body, as serde serializes the Rust struct: fields in declaration order,
    `eventId` left out when absent."""
    doc = {name: order[name] for name, _, _ in WORK_ORDER_FIELDS if order[name] is not None}
    return to_json(doc)


def to_json(doc, sort_keys=False):
    # Compact, non-ASCII kept as UTF-8, control characters as \\u00xx: serde_json's
    # output exactly.
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"), sort_keys=sort_keys).encode("utf-8")
