# The test agent: a FROM-scratch image with static busybox. BEHAVIOR (baked per tag):
#   sleep            run until SIGTERM, then exit 0
#   exit:N           exit with code N after DELAY seconds (default 0)
#   ignore-term      run and ignore SIGTERM (the engine SIGKILLs it after the timeout)
# It prints the PAT file and its environment so tests can read them with `docker logs`.
bb=/bin/busybox
trap 'echo "got SIGTERM"; exit 0' TERM
echo "agent ${CONTROL_PLANE_AGENT_KEY:-?} replica ${FLEET_REPLICA:-?} behaviour ${BEHAVIOR:-sleep}"
if [ -r /run/secrets/agent-pat ]; then echo "pat=$($bb cat /run/secrets/agent-pat)"; fi
for f in /run/secrets/*; do
  n=${f##*/}
  if [ -f "$f" ] && [ "$n" != agent-pat ]; then echo "secret $n=$($bb cat "$f")"; fi
done
case "${BEHAVIOR:-sleep}" in
  exit:*)
    $bb sleep "${DELAY:-0}"
    exit "${BEHAVIOR#exit:}"
    ;;
  ignore-term)
    trap '' TERM
    while true; do $bb sleep 1; done
    ;;
  *)
    while true; do $bb sleep 1 & wait $!; done
    ;;
esac
