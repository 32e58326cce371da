# harness bash tool: sh run TIMEOUT COMMAND PIDS_HIGH
# Installed as RUNNER (root-owned: the agent cannot change it) when the container starts;
# runs as `sh RUNNER TIMEOUT COMMAND PIDS_HIGH` (dash).  stderr joins stdout.
# `timeout` puts itself in a new process group and SIGKILLs that group after TIMEOUT
# seconds; SIGKILL cannot be caught, so the group kill takes timeout along and the exit
# status is 137.  Background jobs (`cmd &`) outlive the command, as in a terminal, except
# when the container is near its pids limit (PIDS_HIGH tasks; 0: no check): a fork bomb
# or a runaway.  Then, before the command, every process left by earlier commands is
# killed (kill -1: all processes the agent may signal, the wrapper excepted); after it,
# the command's own process group.  Only builtins run before `timeout` starts, so this
# works even when no process can be forked: `docker exec` itself still starts, because
# moving a process into a cgroup is not limited by pids.max, only fork is.
exec 2>&1
count() {  # tasks in the container's pids cgroup (v1, then v2); builtins only
  n=0
  { read n </sys/fs/cgroup/pids/pids.current || read n </sys/fs/cgroup/pids.current; } 2>/dev/null
}
if [ "$3" -gt 0 ]; then
  count
  if [ "$n" -ge "$3" ]; then
    was=$n
    kill -KILL -1 2>/dev/null
    i=0
    while [ "$i" -lt 20000 ]; do count; [ "$n" -lt "$3" ] && break; i=$((i + 1)); done
    echo "[sandbox: out of processes ($was tasks):" \
      "all processes left by earlier commands were killed]"
  fi
fi
timeout -s KILL "$1" bash -lc "$2" &
pg=$!
wait "$pg"
rc=$?
if [ "$3" -gt 0 ]; then
  count
  if [ "$n" -ge "$3" ]; then
    kill -KILL -- "-$pg" 2>/dev/null
    echo "[sandbox: out of processes ($n tasks):" \
      "the command's background processes were killed]"
  fi
fi
exit "$rc"
