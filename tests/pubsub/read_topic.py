"""Reads a subscription with Google's own Python client and writes every message that
arrives as one JSON line, at once, until it is stopped (SIGTERM or SIGINT): what the
outbox tests check Inlet's publishing against.

    read_topic.py --subscription projects/P/subscriptions/S

Each line: {"message_id": …, "ordering_key": …, "attributes": {…}, "data": "…"}
(data as UTF-8 text, replaced where it is not). Every message is acked after its line
is written. On an ordered subscription the client calls back the messages of one
ordering key one at a time, in order, so the lines of a key are in delivery order.
"""

import argparse
import json
import signal
import sys
import threading

from google.cloud import pubsub_v1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subscription", required=True, help="projects/P/subscriptions/S")
    args = parser.parse_args()

    lock = threading.Lock()
    stopped = threading.Event()

    def callback(message):
        line = json.dumps(
            {
                "message_id": message.message_id,
                "ordering_key": message.ordering_key,
                "attributes": dict(message.attributes),
                "data": message.data.decode("utf-8", errors="replace"),
            }
        )
        with lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
        message.ack()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopped.set())

    subscriber = pubsub_v1.SubscriberClient()
    future = subscriber.subscribe(args.subscription, callback=callback)
    error = None
    while not stopped.is_set():
        try:
            future.result(timeout=0.5)
        except TimeoutError:
            continue
        except Exception as e:  # the stream failed: say so, the test fails on it
            error = e
            break
    future.cancel()
    if error is not None:
        sys.stderr.write(f"read_topic: the stream failed: {error}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
