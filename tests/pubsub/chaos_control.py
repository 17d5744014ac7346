"""The chaos test's control run: Google's own Python subscriber client, alone (no
Inlet), consuming an unordered subscription of the emulator while it is SIGKILLed as
many times as the chaos test kills Inlet, to show how many messages the emulator
strands for a client that is not Inlet's.

    chaos_control.py --messages N --kills K [--seed S] [--quiet SECONDS]
                     [--gap-min SECONDS] [--gap-max SECONDS]

Run by scripts/chaos-control (which starts an emulator and sets PUBSUB_EMULATOR_HOST).
Creates its topic and subscription (10 s ack deadline, unordered, as in the chaos
test), then K rounds: publish N/K messages, start a consumer process (this file with
--consume), let it run a random gap (seeded), SIGKILL it. A last consumer then runs
until nothing new has arrived for --quiet seconds. Each consumer acks every message
in its callback after appending the message's number to a shared file (O_APPEND, one
write per message), so "received" is what reached a client and was acked.

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


def consume(path: str, quiet: float) -> int:
    """A consumer: acks everything, records each message's number; with quiet > 0
    returns once nothing new arrived for that long, else runs until killed."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    last = [time.monotonic()]

    def callback(message):
        os.write(fd, (message.attributes.get("seq", "?") + "\n").encode())
        last[0] = time.monotonic()
        message.ack()

    subscriber = pubsub_v1.SubscriberClient()
    future = subscriber.subscribe(subscriber.subscription_path(PROJECT, SUBSCRIPTION), callback=callback)
    try:
        while quiet <= 0 or time.monotonic() - last[0] < quiet:
            try:
                future.result(timeout=0.5)
            except TimeoutError:
                pass
    finally:
        future.cancel()
        subscriber.close()
    return 0


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
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--quiet", type=float, default=45.0, help="the last consumer stops after this long without news")
    parser.add_argument("--gap-min", type=float, default=2.5)
    parser.add_argument("--gap-max", type=float, default=6.0)
    parser.add_argument("--consume", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.consume:
        return consume(args.consume, args.quiet if args.quiet > 0 else 0)
    if args.messages < 1 or args.kills < 0:
        parser.error("--messages must be >= 1 and --kills >= 0")
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

    me = [sys.executable, os.path.abspath(__file__), "--consume", path, "--quiet", "0"]
    for k in range(args.kills):
        publish(args.messages * (k + 1) // rounds - published)
        child = subprocess.Popen(me, stdin=subprocess.DEVNULL)
        time.sleep(rng.uniform(args.gap_min, args.gap_max))
        child.send_signal(signal.SIGKILL)
        child.wait()
        print(f"chaos_control: kill {k + 1} of {args.kills}: {received(path)} received so far", file=sys.stderr)
    publish(args.messages - published)
    last = [sys.executable, os.path.abspath(__file__), "--consume", path, "--quiet", str(args.quiet)]
    subprocess.run(last, stdin=subprocess.DEVNULL, check=True)
    got = received(path)
    print(
        json.dumps(
            {
                "published": published,
                "received": got,
                "stranded": published - got,
                "kills": args.kills,
                "seed": seed,
                "seconds": round(time.monotonic() - started, 1),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
