"""The chaos test's control run: Google's own Python subscriber client, alone (no
Inlet), consuming an unordered subscription of the emulator while it is SIGKILLed as
many times as the chaos test kills Inlet, to show how many messages the emulator
strands for a client that is not Inlet's.

    chaos_control.py --messages N --kills K [--consumers C] [--seed S]
                     [--quiet SECONDS] [--last-call SECONDS]
                     [--gap-min SECONDS] [--gap-max SECONDS]

Run by scripts/chaos-control (which starts an emulator and sets PUBSUB_EMULATOR_HOST).
Creates its topic and subscription (10 s ack deadline, unordered, as in the chaos
test) and starts --consumers consumer processes (this file with --consume; 2, like
the chaos test's two instances), then K rounds: publish N/K messages, wait a random
gap (seeded), SIGKILL a random consumer and start it again at once. Then it waits
until nothing new has arrived for --quiet seconds, or --last-call seconds have
passed since the last kill (the chaos test's end rule). Each
consumer acks every message in its callback after appending the message's number to
a shared file (O_APPEND, one write per message), so "received" is what reached a
client and was acked.

Prints one JSON line: {"published", "received", "stranded", "kills", "seconds"}.
"""

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

from google.cloud import pubsub_v1

PROJECT = "inlet-chaos-control"
TOPIC = "orders"
SUBSCRIPTION = "control"


def consume(path: str) -> int:
    """A consumer: acks everything and records each message's number, until killed."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def callback(message):
        os.write(fd, (message.attributes.get("seq", "?") + "\n").encode())
        message.ack()

    subscriber = pubsub_v1.SubscriberClient()
    while True:  # until killed; a stream that fails is opened again
        future = subscriber.subscribe(subscriber.subscription_path(PROJECT, SUBSCRIPTION), callback=callback)
        try:
            future.result()
        except Exception as e:  # noqa: BLE001 - any stream error: report, reopen
            print(f"chaos_control: consumer stream ended ({e}); reopening", file=sys.stderr)


def received(path: str) -> int:
    seen = set()
    with open(path, "rb") as f:
        for line in f.read().split(b"\n")[:-1]:  # the last piece may be torn
            if line.isdigit():
                seen.add(int(line))
    return len(seen)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=4000)
    parser.add_argument("--kills", type=int, default=12)
    parser.add_argument("--consumers", type=int, default=2, help="consumers running at once (one is killed at a time)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--quiet", type=float, default=45.0, help="the run ends after this long without news")
    parser.add_argument(
        "--last-call", type=float, default=90.0, help="... or this long after the last kill, whichever comes first"
    )
    parser.add_argument("--gap-min", type=float, default=2.5)
    parser.add_argument("--gap-max", type=float, default=6.0)
    parser.add_argument("--consume", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.consume:
        return consume(args.consume)
    if args.messages < 1 or args.kills < 0 or args.consumers < 1:
        parser.error("--messages and --consumers must be >= 1 and --kills >= 0")
    seed = args.seed if args.seed is not None else int(time.time())
    rng = random.Random(seed)

    publisher = pubsub_v1.PublisherClient(
        batch_settings=pubsub_v1.types.BatchSettings(max_messages=1000, max_latency=0.01)
    )
    subscriber = pubsub_v1.SubscriberClient()
    topic = publisher.topic_path(PROJECT, TOPIC)
    publisher.create_topic(request={"name": topic})
    subscriber.create_subscription(
        request={
            "name": subscriber.subscription_path(PROJECT, SUBSCRIPTION),
            "topic": topic,
            "ack_deadline_seconds": 10,
        }
    )
    subscriber.close()

    path = os.path.join(tempfile.mkdtemp(prefix="chaos-control-"), "received")
    open(path, "wb").close()
    started = time.monotonic()
    rounds = max(args.kills, 1)
    published = 0

    def publish(count: int) -> None:
        nonlocal published
        futures = []
        for i in range(published, published + count):
            data = f'{{"workOrderId":"key-{i % 100}","completedItems":{i // 100}}}'.encode()
            futures.append(publisher.publish(topic, data, seq=str(i), eventId=f"evt-{i}"))
        for f in futures:
            f.result(timeout=120)
        published += count

    me = [sys.executable, os.path.abspath(__file__), "--consume", path]
    consumers = [subprocess.Popen(me, stdin=subprocess.DEVNULL) for _ in range(args.consumers)]
    for k in range(args.kills):
        publish(args.messages * (k + 1) // rounds - published)
        time.sleep(rng.uniform(args.gap_min, args.gap_max))
        slot = rng.randrange(args.consumers)
        consumers[slot].send_signal(signal.SIGKILL)
        consumers[slot].wait()
        consumers[slot] = subprocess.Popen(me, stdin=subprocess.DEVNULL)
        print(f"chaos_control: kill {k + 1} of {args.kills}: {received(path)} received so far", file=sys.stderr)
    publish(args.messages - published)
    # The end, as in the chaos test: nothing new for --quiet seconds, or --last-call
    # seconds after the last kill (the emulator hands stranded messages back in
    # bursts for many minutes, so quiet may never come).
    size, since = -1, time.monotonic()
    last_call = time.monotonic() + args.last_call
    while time.monotonic() - since < args.quiet and time.monotonic() < last_call:
        now = os.path.getsize(path)
        if now != size:
            size, since = now, time.monotonic()
        time.sleep(0.5)
    for c in consumers:
        c.send_signal(signal.SIGKILL)
        c.wait()
    got = received(path)
    print(
        json.dumps(
            {
                "published": published,
                "received": got,
                "stranded": published - got,
                "kills": args.kills,
                "consumers": args.consumers,
                "seed": seed,
                "seconds": round(time.monotonic() - started, 1),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
