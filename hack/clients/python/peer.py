"""A consumer application with the stock Python client (pulsar-client 3.x, the C++ library
inside) and no subflow code: it subscribes, then prints one JSON line per message its
application receives and acknowledges it. It ends when its standard input closes, so that the
test that started it never leaves it behind.

Flags: --url, --topic, --subscription, --type (Exclusive|Shared|Failover|Key_Shared), --name,
--queue (receiver queue size), --delay-ms (time the application spends on each message, after
reporting it and before acknowledging it).
"""

import argparse
import json
import os
import sys
import threading
import time

import pulsar


def emit(lock, event):
    with lock:
        sys.stdout.write(json.dumps(event) + "\n")
        sys.stdout.flush()


def exit_when_stdin_closes(client):
    def watch():
        while sys.stdin.buffer.read(1024):
            pass
        sys.stdout.flush()
        os._exit(0)  # the process ends; the broker sees the connection close

    threading.Thread(target=watch, daemon=True).start()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--subscription", required=True)
    p.add_argument("--type", default="Shared")
    p.add_argument("--name", default=None)
    p.add_argument("--queue", type=int, default=1000)
    p.add_argument("--delay-ms", type=int, default=0)
    args = p.parse_args()

    client = pulsar.Client(args.url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    consumer = client.subscribe(
        args.topic,
        args.subscription,
        consumer_type=getattr(pulsar.ConsumerType, args.type.replace("_", "")),
        consumer_name=args.name,
        receiver_queue_size=args.queue,
        initial_position=pulsar.InitialPosition.Earliest,
    )
    lock = threading.Lock()
    exit_when_stdin_closes(client)
    emit(lock, {"event": "ready"})
    while True:
        try:
            msg = consumer.receive(timeout_millis=1000)
        except pulsar.Timeout:
            continue
        at = time.time_ns() // 1000  # when the application got it, before printing
        emit(lock, {"event": "message", "value": msg.data().decode("utf-8"), "id": str(msg.message_id()), "atMicros": at})
        if args.delay_ms:
            time.sleep(args.delay_ms / 1000)
        consumer.acknowledge(msg)


if __name__ == "__main__":
    main()
