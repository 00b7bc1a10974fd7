#!/bin/sh
# gpuaas burn-in validation: run once in a validation VM booted on a slot's devices between
# tenants (docs/health.md, "Validation between tenants"). It runs nvidia-smi and, where
# installed, `dcgmi diag -r 1`, and posts each step's result to the host through the guest
# telemetry channel. Without a GPU (the lab's test guest) the GPU steps say "no GPU here",
# never passed. The host reads the results; it never takes the guest's word for more.
id='@ID@' token='@TOKEN@' url='@URL@'
checks=""
add() { # name result(passed|failed|no_gpu|not_installed) detail
  d=$(printf '%s' "$3" | tr -d '"\\' | tr '\n\t' '  ' | cut -c1-300)
  checks="$checks${checks:+,}{\"name\":\"$1\",\"result\":\"$2\",\"detail\":\"$d\"}"
}
if ! command -v nvidia-smi >/dev/null 2>&1; then
  add nvidia-smi no_gpu "no GPU here: nvidia-smi is not installed in this guest"
elif out=$(nvidia-smi -L 2>&1); then
  n=$(printf '%s\n' "$out" | grep -c '^GPU ')
  if [ "$n" -gt 0 ]; then add nvidia-smi passed "$n GPU(s): $out"; else add nvidia-smi no_gpu "no GPU here: $out"; fi
else
  add nvidia-smi failed "$out"
fi
if ! command -v dcgmi >/dev/null 2>&1; then
  add "dcgmi diag -r 1" not_installed "dcgmi is not installed in this guest"
elif out=$(dcgmi diag -r 1 2>&1); then
  add "dcgmi diag -r 1" passed "$(printf '%s\n' "$out" | tail -3)"
else
  add "dcgmi diag -r 1" failed "$(printf '%s\n' "$out" | grep -i fail | head -3)"
fi
body="{\"instance_id\":\"$id\",\"validation\":{\"checks\":[$checks]}}"
for try in 1 2 3 4 5 6 7 8 9 10; do
  if command -v curl >/dev/null 2>&1; then
    curl -fsS -m 10 -H "Authorization: Bearer $token" -H 'Content-Type: application/json' --data "$body" "$url" >/dev/null && exit 0
  else
    wget -q -O /dev/null --header "Authorization: Bearer $token" --header 'Content-Type: application/json' --post-data "$body" "$url" && exit 0
  fi
  sleep 3
done
echo "gpuaas-validate: the host did not take the report" >&2
exit 1
