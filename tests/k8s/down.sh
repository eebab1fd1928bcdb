#!/usr/bin/env bash
# Stops what up.sh STATE_DIR started, newest first.
STATE=$1
[ -f "$STATE/pids" ] || exit 0
tac "$STATE/pids" | while read -r pid _; do kill "$pid" 2>/dev/null || true; done
sleep 1
tac "$STATE/pids" | while read -r pid _; do kill -9 "$pid" 2>/dev/null || true; done
: > "$STATE/pids"
