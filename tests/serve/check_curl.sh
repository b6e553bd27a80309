#!/usr/bin/env bash
# curl against examples/serve started with an API key: 401 without the key or with a
# wrong one (of the same length, and of another), 200 with it; /health needs none;
# a streamed chat arrives as server-sent events ending in [DONE]; --help lists the flags.
#   check_curl.sh SERVE MODEL
set -euo pipefail
serve=$1 model=$2
out=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$out"' EXIT

fail() { echo "check_curl: $*" >&2; exit 1; }

"$serve" --help > "$out/help"
for flag in --model --config --host --port --slots --threads --queue --ctx --max-tokens --max-body --api-key --name \
            --cors --max-connections --read-timeout; do
  grep -q -- "$flag" "$out/help" || fail "--help does not mention $flag"
done
"$serve" --port 99999 2> "$out/err" && fail "--port 99999 was accepted"
grep -q "port takes a whole number from 0 to 65535, got '99999'" "$out/err" || fail "bad --port message: $(cat "$out/err")"

"$serve" --model "$model" --port 0 --slots 1 --threads 1 --api-key s3cret-key > "$out/log" 2>&1 &
pid=$!
for _ in $(seq 200); do grep -q "listening on" "$out/log" && break; sleep 0.05; done
port=$(grep -o '127.0.0.1:[0-9]*' "$out/log" | cut -d: -f2)
[ -n "$port" ] || fail "the server did not start: $(cat "$out/log")"
url=http://127.0.0.1:$port
body='{"messages":[{"role":"user","content":"What is the capital of France?"}],"max_tokens":12,"temperature":0}'

code() { curl -s -o "$out/body" -w '%{http_code}' "$@"; }
[ "$(code "$url/v1/models")" = 401 ] || fail "no key: not 401"
grep -q '"code":"invalid_api_key"' "$out/body" || fail "401 body: $(cat "$out/body")"
[ "$(code -H 'Authorization: Bearer s3cret-kez' "$url/v1/models")" = 401 ] || fail "wrong key of the same length: not 401"
[ "$(code -H 'Authorization: Bearer s3cret-key-and-more' "$url/v1/models")" = 401 ] || fail "longer key: not 401"
[ "$(code -H 'Authorization: Bearer s3cret' "$url/v1/models")" = 401 ] || fail "a prefix of the key: not 401"
[ "$(code -H 'Authorization: s3cret-key' "$url/v1/models")" = 401 ] || fail "no Bearer: not 401"
[ "$(code -d "$body" "$url/v1/chat/completions")" = 401 ] || fail "chat without a key: not 401"
[ "$(code "$url/health")" = 200 ] || fail "/health with no key: not 200"
grep -q '"status":"ok"' "$out/body" || fail "/health body: $(cat "$out/body")"
auth=(-H 'Authorization: Bearer s3cret-key')
[ "$(code "${auth[@]}" "$url/v1/models")" = 200 ] || fail "the right key: not 200"
[ "$(code "${auth[@]}" -H 'Content-Type: application/json' -d "$body" "$url/v1/chat/completions")" = 200 ] || fail "chat: $(cat "$out/body")"
grep -q '"content":"The capital of France is Paris."' "$out/body" || fail "chat answer: $(cat "$out/body")"

curl -sN "${auth[@]}" -d "${body%\}},\"stream\":true}" "$url/v1/chat/completions" > "$out/stream"
[ "$(tail -c 14 "$out/stream" | tr '\n' '|')" = 'data: [DONE]||' ] || fail "the stream does not end with [DONE]: $(tail -c 200 "$out/stream")"
events=$(grep -c '^data: {' "$out/stream")
[ "$events" -ge 5 ] || fail "only $events events in the stream"
text=$(grep '^data: {' "$out/stream" | sed -n 's/.*"content":"\([^"]*\)".*/\1/p' | tr -d '\n')
[ "$text" = "The capital of France is Paris." ] || fail "streamed text '$text'"

kill -TERM "$pid"
wait "$pid" || fail "the server exited with $? on SIGTERM"
echo "check_curl: all passed"
