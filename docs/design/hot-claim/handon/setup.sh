#!/usr/bin/env bash
# Database $1 with today's migrations (../layouts.sh today), 100,000 finished entries and
# 200,000 waiting over 1,000 keys, and the heads of 223 keys in flight, their floors at
# their heads: the state a settle batch meets before it hands its keys on.
set -euo pipefail
db=$1
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
"$here/../layouts.sh" "$db" today
"$here/../backlog.sh" "$db" today 1000 200000 "correlation_key < 'key-3'"
