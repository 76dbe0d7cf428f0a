#!/usr/bin/env bash
# `zq consume --exec`: a worker pool from the shell, no Python of yours.
#
#     ZQ_ENDPOINT=tcp://127.0.0.1:7780 bash examples/consume_exec.sh
#
# Needs a running dispatcher. `zq publish TOPIC` with no data publishes one message per
# stdin line. `zq consume --exec CMD` runs CMD once per message with the payload on its
# stdin: exit status 0 acks the message, anything else cancels it (it is delivered
# again, up to the queue's max_deliveries). -j runs that many at once; -n stops after N
# messages, -t after S seconds without one. At the end it deletes its queue.
set -euo pipefail
export ZQ_ENDPOINT="${ZQ_ENDPOINT:-tcp://127.0.0.1:7780}"
QUEUE=thumbnails.example
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT

seq 1 12 | sed 's/^/image-/; s/$/.png/' | zq publish "$QUEUE" > /dev/null

# The "work": write a file named after the payload. Four at a time; stop after 12.
export OUT
zq consume "$QUEUE" -j 4 -n 12 -t 10 --exec 'read name; echo "resized $name" > "$OUT/$name.done"'

done_count=$(ls "$OUT" | wc -l)
echo "processed $done_count images with 4 shell workers"
zq queue delete "$QUEUE" --yes > /dev/null  # leave the dispatcher as we found it
test "$done_count" -eq 12
