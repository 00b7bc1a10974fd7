#!/bin/sh
# gpuaas guest telemetry helper: POSTs a snapshot to the host with the per-allocation token,
# with the guest's GPU health readings (docs/health.md, "Guest telemetry"): the Xid codes the
# kernel logged since the last report that reached the host, and each GPU's volatile
# uncorrectable ECC count when it differs from the last one delivered. GPUs are named by position: the guest's NVIDIA display-class PCI
# functions in address order, which is the allocation's slot order.
export LC_ALL=C
. "${GPUAAS_INSTANCE_ENV:-/etc/gpuaas/instance.env}"
sys=${GPUAAS_SYS:-/sys}
seen=${GPUAAS_STATE_DIR:-/var/lib/gpuaas}/xid-reported
gpus=""
if command -v nvidia-smi >/dev/null 2>&1; then
  gpus=$(nvidia-smi --query-gpu=index,utilization.gpu,memory.used,temperature.gpu --format=csv,noheader,nounits | tr '\n' ';')
fi
order=""
for d in "$sys"/bus/pci/devices/*; do
  [ "$(cat "$d/vendor" 2>/dev/null)" = 0x10de ] || continue
  case "$(cat "$d/class" 2>/dev/null)" in 0x03*) order="$order ${d##*/}" ;; esac
done
health='"gpu_health":"no GPU in this guest"'
boot=$(cat /proc/sys/kernel/random/boot_id 2>/dev/null)
last=""
if [ -n "$order" ]; then
  since=-1 prev=""
  if read -r b t e <"$seen" 2>/dev/null && [ "$b" = "$boot" ]; then since=$t prev=$e; fi
  smi=""
  if command -v nvidia-smi >/dev/null 2>&1; then smi=$(nvidia-smi -q -x 2>/dev/null); fi
  out=$({ printf '%s\n' "$smi"; echo '@@klog'; dmesg 2>/dev/null | grep 'NVRM: Xid'; } | awk -v order="$order" -v since="$since" -v prev="$prev" '
    # key: bus:device of a PCI address, whatever its domain width or function.
    function key(a) { a = tolower(a); sub(/^[0-9a-f]+:/, "", a); sub(/\..*$/, "", a); return a }
    BEGIN { n = split(order, pos, " "); for (i = 1; i <= n; i++) idx[key(pos[i])] = i - 1; gi = -1; last = since; nx = 0; seen_gpu = 0 }
    $0 == "@@klog" { klog = 1; next }
    !klog && /<gpu id="/ { match($0, /id="[^"]*"/); k = key(substr($0, RSTART + 4, RLENGTH - 5)); gi = (k in idx) ? idx[k] : -1; seen_gpu = 1; next }
    !klog && /<ecc_errors>/ { inecc = 1; next }
    !klog && /<\/ecc_errors>/ { inecc = 0; next }
    !klog && inecc && /<volatile>/ { invol = 1; next }
    !klog && /<\/volatile>/ { invol = 0; next }
    !klog && invol && /<double_bit>/ { indb = 1; next }
    !klog && invol && /<\/double_bit>/ { indb = 0; next }
    !klog && invol && gi >= 0 && (/<dram_uncorrectable>|<sram_uncorrectable_parity>|<sram_uncorrectable_secded>/ || (indb && /<total>/)) {
      v = $0; gsub(/<[^>]*>|[ \t\r]/, "", v); if (v ~ /^[0-9]+$/) ecc[gi] += v; next }
    klog {
      ts = $0; if (!sub(/^[^[]*\[ */, "", ts)) next; sub(/\].*$/, "", ts); if (ts !~ /^[0-9]+(\.[0-9]+)?$/ || ts + 0 <= since + 0) next
      if (ts + 0 > last + 0) last = ts
      if (!match($0, /Xid \((PCI:)?[0-9a-fA-F]+:[0-9a-fA-F]+:[0-9a-fA-F]+/)) next
      a = substr($0, RSTART, RLENGTH); sub(/^Xid \((PCI:)?/, "", a); k = key(a)
      c = substr($0, RSTART + RLENGTH); if (!sub(/^[^)]*\): */, "", c)) next; sub(/[^0-9].*$/, "", c)
      if (c == "" || !(k in idx) || nx >= 16) next
      xid[nx++] = "{\"gpu_index\":" idx[k] ",\"code\":" (c + 0) "}"
    }
    END {
      s = "\"xid\":["; for (i = 0; i < nx; i++) s = s (i ? "," : "") xid[i]; s = s "]"
      e = prev
      if (seen_gpu) { e = "["; for (i = 0; i < n; i++) e = e (i ? "," : "") (ecc[i] + 0); e = e "]" }
      else s = s ",\"gpu_health\":\"no nvidia-smi reading: no ECC counts\""
      if (seen_gpu && e != prev) s = s ",\"ecc_uncorrectable\":" e
      print s; print last; print e
    }')
  health=$(printf '%s\n' "$out" | sed -n 1p)
  last=$(printf '%s\n' "$out" | sed -n 2p)
  ecc=$(printf '%s\n' "$out" | sed -n 3p)
fi
body=$(printf '{"instance_id":"%s","loadavg":"%s","mem_available_kb":%s,"gpus":"%s",%s}' \
  "$GPUAAS_INSTANCE_ID" "$(cut -d' ' -f1-3 /proc/loadavg)" "$(awk '/MemAvailable/{print $2}' /proc/meminfo)" "$gpus" "$health")
curl -fsS -m 10 -H "Authorization: Bearer $GPUAAS_TELEMETRY_TOKEN" -H 'Content-Type: application/json' \
  --data "$body" "$GPUAAS_TELEMETRY_URL" >/dev/null || exit 1
# Only what the host has: a report that did not arrive is sent again next time.
if [ -n "$order" ]; then
  mkdir -p "${seen%/*}" && printf '%s %s %s\n' "$boot" "$last" "$ecc" >"$seen"
fi
