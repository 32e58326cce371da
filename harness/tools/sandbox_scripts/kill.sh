# harness bash tool: sh kill EXEC_ID
# Installed as KILLER; runs as `sh KILLER EXEC_ID` as the agent (it may read its own
# processes' /proc/PID/environ; root without CAP_SYS_PTRACE may not): kill the process
# groups of, then the processes themselves tagged HARNESS_EXEC_ID=$1.  Three rounds catch
# children forked during the first.
for round in 1 2 3; do
  pids=$(grep -lsz "^HARNESS_EXEC_ID=$1\$" /proc/[0-9]*/environ | cut -d/ -f3)
  [ -z "$pids" ] && exit 0
  for p in $pids; do
    g=$(ps -o pgid= -p "$p" 2>/dev/null | tr -d ' ')
    [ -n "$g" ] && kill -KILL -- "-$g" 2>/dev/null
  done
  kill -KILL $pids 2>/dev/null
  sleep 0.1
done
