"""Checks, with Google's own Python client, that a subscription has nothing left to
deliver: it opens a streaming pull for --quiet seconds and reports every message
that arrives (nacking it, so the check changes nothing).

    drained.py --subscription projects/P/subscriptions/S --quiet SECONDS

Streaming pull, not unary pull: the emulator's unary pull fails with an internal
error (a NullPointerException in OrderedMessageBacklog) on ordered subscriptions
that a streaming pull has consumed. A message not acked by its last consumer comes
back once its ack deadline passes, so --quiet must exceed the subscription's ack
deadline for the check to mean anything.

Prints one JSON line: {"received": N, "message_ids": [...], "seconds": S}.
"""

import argparse
import json
import threading
import time

from google.cloud import pubsub_v1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subscription", required=True, help="projects/P/subscriptions/S")
    parser.add_argument("--quiet", type=float, required=True, help="seconds to listen")
    args = parser.parse_args()

    received = []
    lock = threading.Lock()

    def callback(message):
        with lock:
            received.append(message.message_id)
        message.nack()

    subscriber = pubsub_v1.SubscriberClient()
    started = time.monotonic()
    future = subscriber.subscribe(args.subscription, callback=callback)
    try:
        future.result(timeout=args.quiet)
    except TimeoutError:
        pass
    except Exception as e:  # a stream error is a failed check, not an empty one
        future.cancel()
        print(json.dumps({"error": str(e)}))
        return 1
    future.cancel()
    try:
        future.result(timeout=10)
    except Exception:
        pass
    subscriber.close()
    with lock:
        ids = list(received)
    print(json.dumps({"received": len(ids), "message_ids": ids[:20], "seconds": time.monotonic() - started}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
