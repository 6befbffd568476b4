#!/usr/bin/env bash
# A walkthrough of txbroker's HTTP API with nothing but curl: create a topic, write records, read
# them back, long-poll, list offsets, see two errors, delete the topic.
#
#   examples/curl-walkthrough.sh [BASE_URL]        (default http://127.0.0.1:8080)
#
# Each step prints its curl command, ready to copy, and the response. The script checks each
# response (status code and key fields, with python3) and stops with a message at the first one
# that is not what the API contract (docs/api.md) says. Bodies are sent with plain `curl -d`: the server
# reads every body as JSON, whatever Content-Type curl declares.
set -euo pipefail

BASE=${1:-http://127.0.0.1:8080}
BASE=${BASE%/}
TOPIC="walkthrough-$$-$RANDOM"
TOPIC_CREATED=no
POLL_OUTPUT=$(mktemp)
STATUS=""
BODY=""

fail() {
    printf '\nFAILED: %s\n' "$*" >&2
    exit 1
}

cleanup() {
    rm -f "$POLL_OUTPUT"
    if [[ $TOPIC_CREATED == yes ]]; then  # a failed run leaves no topic behind
        curl -sS -o /dev/null -X DELETE "$BASE/v1/topics/$TOPIC" || true
    fi
}
trap cleanup EXIT

step() {
    printf '\n=== %s\n' "$*"
}

# The arguments as one shell command line, quoted only where the shell needs it, so it can be copied.
shell_line() {
    local arg words=()
    for arg in "$@"; do
        if [[ $arg =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then
            words+=("$arg")
        else
            words+=("'${arg//\'/\'\\\'\'}'")
        fi
    done
    printf '%s' "${words[*]}"
}

# run EXPECTED_STATUS curl ARGS...: prints the command, runs it, prints the response; the body and
# status code are left in $BODY and $STATUS. Stops unless the status is the expected one.
run() {
    local expected=$1 output
    shift
    printf '$ %s\n' "$(shell_line "$@")"
    if ! output=$("$@" -w '\n%{http_code}'); then
        fail "curl could not complete the request; is txbroker running at $BASE?"
    fi
    STATUS=${output##*$'\n'}
    BODY=${output%$'\n'*}
    if [[ -n $BODY ]]; then printf '%s\n' "$BODY"; fi
    printf '(HTTP %s)\n' "$STATUS"
    [[ $STATUS == "$expected" ]] || fail "expected HTTP $expected, got $STATUS"
}

# expect PYTHON_EXPRESSION DESCRIPTION: checks the expression over the last response body, `r`.
expect() {
    python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
sys.exit(0 if eval(sys.argv[1]) else 1)
' "$1" <<<"$BODY" || fail "$2 (expected: $1)"
    printf '  ok: %s\n' "$2"
}

# value PYTHON_EXPRESSION: prints the expression's value over the last response body, `r`.
value() {
    python3 -c 'import json, sys; r = json.loads(sys.stdin.read()); print(eval(sys.argv[1]))' "$1" <<<"$BODY"
}

step "The server is up"
run 200 curl -sS "$BASE/v1/health"
expect 'r["status"] == "ok" and r["database"] == "ok"' "status ok, database ok"

step "Create a topic with 3 partitions"
run 201 curl -sS -d "{\"name\": \"$TOPIC\", \"partitions\": 3}" "$BASE/v1/topics"
TOPIC_CREATED=yes
expect "r['name'] == '$TOPIC' and len(r['partitions']) == 3" "topic $TOPIC has 3 partitions"
expect 'all(p["high_watermark"] == 0 for p in r["partitions"])' "every partition is empty"

step "Write a record with a header to partition 0"
run 200 curl -sS -d '{"partition": 0, "records": [{"key": "user-1", "value": "hello", "headers": [{"key": "source", "value": "walkthrough"}]}]}' \
    "$BASE/v1/topics/$TOPIC/records"
expect 'r["partition"] == 0 and r["base_offset"] == 0 and r["last_offset"] == 0 and r["error"] is None' \
    "appended at offset 0 of partition 0"

step "Write a record without a partition: its key chooses one (murmur2, as Kafka's default partitioner)"
run 200 curl -sS -d '{"records": [{"key": "user-2", "value": "routed by key"}]}' "$BASE/v1/topics/$TOPIC/records"
expect '0 <= r["partition"] < 3 and r["error"] is None' "appended to one of the 3 partitions"
KEYED_PARTITION=$(value 'r["partition"]')
KEYED_OFFSET=$(value 'r["base_offset"]')

step "Produce two records to partition 0 (producer_id -1: a plain, non-transactional write)"
run 200 curl -sS -d "{\"producer_id\": -1, \"producer_epoch\": -1, \"partitions\": [{\"topic\": \"$TOPIC\", \"partition\": 0, \"records\": [{\"value\": \"second\"}, {\"key\": \"user-1\", \"value\": \"third\", \"timestamp_ms\": 1700000000000}]}]}" \
    "$BASE/v1/produce"
expect 'len(r["partitions"]) == 1 and r["partitions"][0]["error"] is None' "one partition result, no error"
expect 'r["partitions"][0]["base_offset"] == 1 and r["partitions"][0]["last_offset"] == 2' "offsets 1 and 2"

step "Fetch partition 0 from offset 0"
run 200 curl -sS -d "{\"partitions\": [{\"topic\": \"$TOPIC\", \"partition\": 0, \"offset\": 0}]}" "$BASE/v1/fetch"
expect '[x["value"] for x in r["partitions"][0]["records"]] == ["hello", "second", "third"]' "the 3 records, in order"
expect '[x["offset"] for x in r["partitions"][0]["records"]] == [0, 1, 2]' "at offsets 0, 1, 2"
expect 'r["partitions"][0]["records"][0]["headers"] == [{"key": "source", "value": "walkthrough"}]' \
    "the header came back"
expect 'r["partitions"][0]["records"][2]["timestamp_ms"] == 1700000000000' "the given timestamp came back"
expect 'r["partitions"][0]["next_offset"] == 3 and r["partitions"][0]["high_watermark"] == 3' \
    "next_offset 3, high_watermark 3"

step "Read one record of the keyed partition with GET"
run 200 curl -sS "$BASE/v1/topics/$TOPIC/partitions/$KEYED_PARTITION/records?offset=$KEYED_OFFSET&max_records=1"
expect '[(x["key"], x["value"]) for x in r["records"]] == [("user-2", "routed by key")]' "the keyed record"

step "Long-poll: a fetch at the end of partition 0 waits (max_wait_ms) until a record arrives"
POLL=(curl -sS -d "{\"max_wait_ms\": 10000, \"partitions\": [{\"topic\": \"$TOPIC\", \"partition\": 0, \"offset\": 3}]}" "$BASE/v1/fetch")
printf '$ %s &\n' "$(shell_line "${POLL[@]}")"
"${POLL[@]}" -w '\n%{http_code} %{time_total}\n' >"$POLL_OUTPUT" &
POLL_PID=$!
sleep 1
printf '(waiting in the background; now write to partition 0)\n'
run 200 curl -sS -d '{"partition": 0, "records": [{"value": "wake up"}]}' "$BASE/v1/topics/$TOPIC/records"
wait "$POLL_PID" || fail "the long-polling curl failed"
read -r STATUS POLL_SECONDS < <(tail -n 1 "$POLL_OUTPUT")
BODY=$(sed '$d' "$POLL_OUTPUT")
printf 'the background fetch answered after %s s:\n%s\n(HTTP %s)\n' "$POLL_SECONDS" "$BODY" "$STATUS"
[[ $STATUS == 200 ]] || fail "expected HTTP 200 from the long poll, got $STATUS"
expect '[(x["offset"], x["value"]) for x in r["partitions"][0]["records"]] == [(3, "wake up")]' \
    "the long poll returned the new record"
python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) < 9 else 1)' "$POLL_SECONDS" \
    || fail "the long poll took $POLL_SECONDS s: it should answer when the record arrives, not at max_wait_ms"
printf '  ok: it answered when the record arrived, before max_wait_ms\n'

step "List the earliest (-2) and latest (-1) offsets of partition 0"
run 200 curl -sS -d "{\"partitions\": [{\"topic\": \"$TOPIC\", \"partition\": 0, \"timestamp\": -2}, {\"topic\": \"$TOPIC\", \"partition\": 0, \"timestamp\": -1}]}" \
    "$BASE/v1/offsets/list"
expect '[p["offset"] for p in r["partitions"]] == [0, 4] and all(p["error"] is None for p in r["partitions"])' \
    "earliest 0, latest 4"

step "Error: writing to a topic that does not exist"
run 404 curl -sS -d '{"records": [{"value": "lost"}]}' "$BASE/v1/topics/$TOPIC-missing/records"
expect 'r["error"]["code"] == "UNKNOWN_TOPIC_OR_PARTITION" and r["error"]["retriable"] is False' \
    "UNKNOWN_TOPIC_OR_PARTITION, not retriable"

step "Error: a malformed body"
run 400 curl -sS -d '{"partitions": [' "$BASE/v1/fetch"
expect 'r["error"]["code"] == "INVALID_REQUEST" and r["error"]["message"]' "INVALID_REQUEST, with a message"

step "Delete the topic"
run 204 curl -sS -X DELETE "$BASE/v1/topics/$TOPIC"
TOPIC_CREATED=no
run 404 curl -sS "$BASE/v1/topics/$TOPIC"
expect 'r["error"]["code"] == "UNKNOWN_TOPIC_OR_PARTITION"' "the topic is gone"

printf '\nThe walkthrough passed against %s.\n' "$BASE"
