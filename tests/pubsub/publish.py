"""Publishes work-order events to a Pub/Sub topic with Google's own Python client, so
the messages the pull-source tests consume come from a client that is not Inlet's.

    publish.py --topic projects/P/topics/T --count N --keys K [--start S] [--ordered]
               [--data-file PATH] [--attribute NAME=VALUE ...] [--spread SECONDS]

Run by tests/testkit (publish_independent) with the python of scripts/ensure-py-pubsub.
The client talks to the emulator named by PUBSUB_EMULATOR_HOST by itself (no
credentials needed). The topic must exist.

Message i, for i in S..S+N-1, belongs to key `key-{i % K}` and is that key's message
number i // K (so calls with consecutive ranges continue every key's sequence):

- data: the work-order event of tests/relay.rs, `workOrderId` = the key and
  `completedItems` = the per-key number; the work-order plugin makes the key the
  correlation key, and FakeCamunda's `correlated_seqs` reads `completedItems` back;
- attributes: `seq` = i, `key` = the key, and `eventId` = `evt-{i}`, the plugin's dedup
  key: the same i published twice is one inbox entry (as a redelivery would be), even
  after an emulator restart, which numbers message ids from 1 again;
- ordering key: the key, with --ordered (and message ordering enabled on the client).

With --attribute, every message also gets that attribute (for routing by content).

With --spread, the publishes are spaced evenly over that many seconds, each sent on
its own, instead of going out together: the emulator hands what it has to whichever
stream of the subscription polls first (each polls every 50 ms), a stream that is gone
included, so messages sent together all go to one stream, and messages spread out each
take their own chance.

With --data-file, every message's data is that file's bytes instead of the event (for
large messages: Pub/Sub takes up to 10 MB); the attributes stay as above.

Prints one JSON line on stdout, {"published": N, "seconds": S, "rate": R}, timed from
the first publish until every publish was confirmed. Exits non-zero, with the errors on
stderr, if any publish failed or was not confirmed within --timeout seconds.
"""

import argparse
import concurrent.futures
import json
import os
import sys
import time

from google.cloud import pubsub_v1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topic", required=True, help="projects/P/topics/T")
    parser.add_argument("--count", type=int, required=True, help="messages to publish")
    parser.add_argument("--keys", type=int, required=True, help="keys to spread them over")
    parser.add_argument("--start", type=int, default=0, help="number of the first message")
    parser.add_argument("--ordered", action="store_true", help="publish with ordering keys")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for confirmations")
    parser.add_argument("--data-file", help="publish this file's bytes as every message's data")
    parser.add_argument("--spread", type=float, default=0.0, help="seconds to space the publishes over")
    parser.add_argument(
        "--attribute", action="append", default=[], metavar="NAME=VALUE", help="an attribute every message gets"
    )
    args = parser.parse_args()
    extra = {}
    for pair in args.attribute:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            parser.error(f"--attribute takes NAME=VALUE, not {pair!r}")
        extra[name] = value
    if args.count < 0 or args.keys < 1 or args.start < 0 or args.spread < 0:
        parser.error("--count, --start and --spread must be >= 0 and --keys >= 1")

    publisher = pubsub_v1.PublisherClient(
        batch_settings=pubsub_v1.types.BatchSettings(max_messages=1000, max_latency=0.01),
        publisher_options=pubsub_v1.types.PublisherOptions(enable_message_ordering=args.ordered),
    )

    payload = None
    if args.data_file is not None:
        with open(args.data_file, "rb") as f:
            payload = f.read()

    started = time.monotonic()
    futures = {}
    for i in range(args.start, args.start + args.count):
        if args.spread > 0:
            due = started + (i - args.start) * args.spread / args.count
            time.sleep(max(0.0, due - time.monotonic()))
        key = f"key-{i % args.keys}"
        # The byte-for-byte format of work_order() in tests/relay.rs.
        data = (
            f'{{"workOrderId":"{key}","completedItems":{i // args.keys},'
            f'"completionTimestamp":"2026-08-01T10:00:00Z"}}'
        ).encode()
        if payload is not None:
            data = payload
        future = publisher.publish(
            args.topic,
            data,
            ordering_key=key if args.ordered else "",
            seq=str(i),
            key=key,
            eventId=f"evt-{i}",
            **extra,
        )
        futures[future] = i

    done, pending = concurrent.futures.wait(futures, timeout=args.timeout)
    seconds = time.monotonic() - started
    failed = sorted((futures[f], f.exception()) for f in done if f.exception() is not None)

    if failed or pending:
        print(
            f"publish.py: {len(failed)} of {args.count} publishes to {args.topic} failed and "
            f"{len(pending)} were not confirmed within {args.timeout} s",
            file=sys.stderr,
        )
        # With ordering, one failure pauses its key and fails every later publish of
        # it: the first errors are the ones that matter.
        for i, error in failed[:10]:
            print(f"  message {i}: {type(error).__name__}: {error}", file=sys.stderr)
        sys.stderr.flush()
        # Not publisher.stop(): it would wait for the unconfirmed batches.
        os._exit(1)

    publisher.stop()

    rate = args.count / seconds if seconds > 0 else 0.0
    print(json.dumps({"published": args.count, "seconds": round(seconds, 3), "rate": round(rate, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
