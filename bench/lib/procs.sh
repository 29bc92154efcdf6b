# Sourced by bench/rls.sh and bench/bandwidth.sh: loopback ports and a process's CPU time.
#
#   free_port          a free TCP port on 127.0.0.1
#   wait_port PORT     until something listens on it (10 s at most)
#   cpu_ticks PID      user + system CPU of PID so far, in clock ticks ($tck a second)

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 200); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 never opened" >&2; return 1; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
tck=$(getconf CLK_TCK)
