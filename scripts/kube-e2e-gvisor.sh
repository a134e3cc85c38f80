# The gVisor RuntimeClass leg of scripts/kubernetes-e2e.sh, which sources
# this file (it is not run on its own) and calls:
#
#   gvisor_build            in build_all: gVisor's containerd shim
#                           (scripts/runsc-shim.sh, cached by version), the
#                           syscall probe, the shim's configuration, and
#                           RUNSC_CONTAINERD, the `runsc` runtime handler the
#                           node's containerd configuration then holds
#   gvisor_leg URL KEY      once the cluster and an airlock replica (URL,
#                           API key KEY) run: the Helm chart's RuntimeClass
#                           gvisor (handler runsc) in place; a sandbox created
#                           with "runtime": "gvisor" through the kubernetes
#                           backend lands in a pod with runtimeClassName
#                           gvisor; exec, a file and a Python cell work; on
#                           the host the container is a runsc sentry of this
#                           node's shim, and no host process is the agent or
#                           the sandbox's processes; the syscall probe
#                           (internal/probe) runs in the pod with 0 escapes
#                           (kube-e2e escape); kill removes Sandbox, pod and
#                           sentry; and, as a control, the same check on a
#                           native (runc) sandbox sees its processes on the
#                           host.
#
# It uses the caller's globals and helpers (ROOT, S, CTR, NS, kc, log, die,
# wait_for). KUBE_E2E_GVISOR=0 leaves the leg out (the run then says so).
# The runsc it runs is /usr/local/bin/runsc, the one scripts/setup.sh builds
# from go.mod's gVisor version; the shim is built from the same version.

# gvisor_build builds and configures what the leg needs.
gvisor_build() {
	RUNSC_CONTAINERD=
	if [ "${KUBE_E2E_GVISOR:-1}" != 1 ]; then
		log "KUBE_E2E_GVISOR=${KUBE_E2E_GVISOR}: the gVisor RuntimeClass leg is left out"
		return 0
	fi
	[ -x /usr/local/bin/runsc ] || die "no /usr/local/bin/runsc: run scripts/setup.sh (it builds runsc from go.mod's gVisor version)"
	local t0
	t0=$(date +%s)
	RUNSC_SHIM=$("$ROOT/scripts/runsc-shim.sh" | tail -1) && [ -x "$RUNSC_SHIM" ] ||
		die "scripts/runsc-shim.sh failed to build containerd-shim-runsc-v1"
	log "containerd-shim-runsc-v1 at $RUNSC_SHIM ($(($(date +%s) - t0))s)"
	(cd "$ROOT" && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$S/probe" ./internal/probe) ||
		die "building the syscall probe (internal/probe) failed"
	mkdir -p "$S/runsc-logs"
	# The shim's own options (runsc.Options of gvisor.dev/gvisor/pkg/shim/v1/runsc),
	# read from ConfigPath below: the runsc to run, its state root (this
	# run's, so cleanup finds what is left), and runsc's flags. systrap:
	# the platform airlock's gvisor tier uses (no KVM in these VMs);
	# oci-seccomp: the pod's seccomp profile (RuntimeDefault) applied by the
	# sentry to the sandbox's system calls, as the tier does.
	cat >"$S/runsc-shim.toml" <<EOF
binary_name = "/usr/local/bin/runsc"
root = "$S/runsc"
log_path = "$S/runsc-logs/shim-%ID%.log"
log_level = "info"
[runsc_config]
  platform = "systrap"
  oci-seccomp = "true"
  debug-log = "$S/runsc-logs/%ID%/"
EOF
	# containerd 1.6's CRI: a runtime of type io.containerd.runsc.v1 whose
	# options are the runtimeoptions the shim reads (TypeUrl, ConfigPath).
	# containerd finds the shim binary, containerd-shim-runsc-v1, on its
	# PATH (1.6's CRI ignores runtime_path: "binary not installed
	# containerd-shim-runsc-v1" with it set), so a directory holding it
	# goes first on the PATH containerd, started after this, inherits.
	#
	# And containerd 1.6 reads what a shim's `start` prints as the bare
	# address of its socket, where this gVisor's shim (built on containerd
	# 2's shim library) prints containerd 2's bootstrap JSON
	# ({"version":2,"address":"unix://…","protocol":"ttrpc"}; 1.6 fails
	# "dial unix {"version":2,…}: connect: invalid argument"; containerd
	# 1.7 and newer read both). So containerd gets a wrapper of that name
	# that passes every call through and turns start's JSON into its
	# address (1.6 reads stdout and stderr together: the shim's stderr
	# goes to a log); the long-running shim it starts is the real binary.
	mkdir -p "$S/shim-bin"
	cat >"$S/shim-bin/containerd-shim-runsc-v1" <<EOF
#!/bin/sh
# containerd 1.6 -> gVisor's shim (scripts/kube-e2e-gvisor.sh says why).
case " \$* " in
*" start ")
	out=\$("$RUNSC_SHIM" "\$@" 2>>"$S/runsc-logs/shim-start.log") || { rc=\$?; printf '%s' "\$out"; exit \$rc; }
	addr=\$(printf '%s' "\$out" | sed -n 's/^{.*"address":"\([^"]*\)".*}\$/\1/p')
	printf '%s' "\${addr:-\$out}"
	;;
*) exec "$RUNSC_SHIM" "\$@" ;;
esac
EOF
	chmod 0755 "$S/shim-bin/containerd-shim-runsc-v1"
	export PATH="$S/shim-bin:$PATH"
	RUNSC_CONTAINERD="    [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runsc]
      runtime_type = \"io.containerd.runsc.v1\"
      [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runsc.options]
        TypeUrl = \"io.containerd.runsc.v1.options\"
        ConfigPath = \"$S/runsc-shim.toml\""
	# On a failed run, kill what runsc left of this run's pods (sentries
	# and gofers, whose --root is this run's) before the main cleanup,
	# which then sees the run's exit status as $? (set +e first: under
	# set -e the `exit` subshell would end the trap there).
	trap 'gvisor_rc=$?; set +e; [ "$gvisor_rc" = 0 ] || gvisor_reap; (exit "$gvisor_rc"); cleanup' EXIT
}

# gvisor_reap kills this run's runsc processes.
gvisor_reap() {
	local pid
	for pid in $(pgrep -f -- "--root=$S/runsc/" 2>/dev/null); do
		kill -KILL "$pid" 2>/dev/null
	done
}

# gvisor_fail prints what helps to see why the leg failed, then dies.
gvisor_fail() {
	{
		[ -n "${GV_POD:-}" ] && kc describe pod "$GV_POD" -n "$NS" 2>&1 | tail -n 30
		for f in "$S"/runsc-logs/*.log; do
			[ -f "$f" ] && echo "----- last lines of $f" && tail -n 20 "$f"
		done
	} >&2
	die "gVisor leg: $*"
}

# gvisor_leg URL KEY runs the leg against an airlock replica.
gvisor_leg() {
	[ "${KUBE_E2E_GVISOR:-1}" = 1 ] || return 0
	local url=$1 key=$2 t0 id cid apid cmd handler
	t0=$(date +%s)
	# The RuntimeClass is the Helm chart's (installed with the rest of airlock).
	handler=$(kc get runtimeclass gvisor -o jsonpath='{.handler}')
	[ "$handler" = runsc ] || gvisor_fail "RuntimeClass gvisor (deploy/helm/airlock's) has handler '$handler', want runsc (containerd's runtime above)"
	id=$("$S/kube-e2e" drive create -runtime gvisor -url "$url" -key "$key" -state "$S/drive-gvisor.json") ||
		gvisor_fail "create/exec/files/code of a gvisor sandbox failed"
	log "gvisor sandbox $id: created, exec, file and Python cell ($(($(date +%s) - t0))s)"
	GV_POD=$(kc get pods -n "$NS" -l "airlock.dev/sandbox=$id" -o jsonpath='{.items[0].metadata.name}')
	[ -n "$GV_POD" ] || gvisor_fail "no pod labelled airlock.dev/sandbox=$id"
	[ "$(kc get pod "$GV_POD" -n "$NS" -o jsonpath='{.spec.runtimeClassName}')" = gvisor ] ||
		gvisor_fail "pod $GV_POD of gvisor sandbox $id has runtimeClassName '$(kc get pod "$GV_POD" -n "$NS" -o jsonpath='{.spec.runtimeClassName}')', want gvisor"
	# From the host: the container's process is runsc's sandbox (the
	# sentry) under this run's runsc root, served by gVisor's shim; no
	# host process is the agent of this pod.
	cid=$(kc get pod "$GV_POD" -n "$NS" -o jsonpath='{.status.containerStatuses[?(@.name=="sandbox")].containerID}')
	apid=$("${CTR[@]}" tasks ls | awk -v c="${cid#containerd://}" '$1 == c {print $2}')
	[ -n "$apid" ] && [ -r "/proc/$apid/cmdline" ] || gvisor_fail "no host process for the sandbox container $cid"
	cmd=$(tr '\0' ' ' <"/proc/$apid/cmdline")
	case $cmd in
	runsc-sandbox*"--root=$S/runsc/"*boot*) ;; # the shim's root, per containerd namespace
	*) gvisor_fail "the gvisor pod's container (host pid $apid) is not a runsc sentry of this node: $cmd" ;;
	esac
	pgrep -f -- "containerd-shim-runsc-v1 .*-address $S/containerd.sock" >/dev/null ||
		gvisor_fail "no containerd-shim-runsc-v1 serves this node's containerd"
	local pod_uid pid agents=()
	pod_uid=$(kc get pod "$GV_POD" -n "$NS" -o jsonpath='{.metadata.uid}')
	for pid in $(pgrep -f -- "airlock-bin/airlock agent"); do
		grep -q "pod${pod_uid}" "/proc/$pid/cgroup" 2>/dev/null && agents+=("$pid")
	done
	[ ${#agents[@]} = 0 ] || gvisor_fail "host processes ${agents[*]} run the agent of gvisor pod $GV_POD on the host kernel"
	log "pod $GV_POD: runtimeClassName gvisor; its container on the host is runsc's sentry (pid $apid: ${cmd:0:60}...); no host process runs its agent"
	# The syscall probe inside the pod, as the sandbox's user; a host file
	# it must not see; its processes looked for among the host's.
	echo "host only" >"$S/gvisor-secret"
	local out
	out=$("$S/kube-e2e" escape -url "$url" -key "$key" -id "$id" -probe "$S/probe" -secret "$S/gvisor-secret" 2>"$S/logs/gvisor-escape.log") ||
		gvisor_fail "the escape probe in gvisor pod $GV_POD: $(tail -n 3 "$S/logs/gvisor-escape.log")"
	[ "$out" = "escapes: 0" ] || gvisor_fail "escape probe: $out"
	log "escape probe in gvisor pod $GV_POD: $out ($(grep -o 'host processes with its marker: [0-9]* of [0-9]*' "$S/logs/gvisor-escape.log"))"
	"$S/kube-e2e" drive kill -url "$url" -key "$key" -state "$S/drive-gvisor.json" || gvisor_fail "kill of gvisor sandbox $id failed"
	kc wait --for=delete "sandboxes.agents.x-k8s.io/$id" -n "$NS" --timeout=120s >/dev/null 2>&1 || gvisor_fail "Sandbox $id still exists after kill"
	kc wait --for=delete "pod/$GV_POD" -n "$NS" --timeout=120s >/dev/null 2>&1 || gvisor_fail "pod $GV_POD still exists after kill"
	wait_for "gvisor sentry $apid gone" 60 sh -c "! [ -d /proc/$apid ]" || gvisor_fail "runsc's sentry $apid outlived its sandbox"
	# Control: the same check on a sandbox of the native tier (runc) finds
	# its marker process among the host's processes, so the count above
	# is not blind.
	local nid
	nid=$("$S/kube-e2e" drive create -url "$url" -key "$key" -state "$S/drive-control.json") ||
		gvisor_fail "control: create of a native sandbox failed"
	if "$S/kube-e2e" escape -url "$url" -key "$key" -id "$nid" -probe "$S/probe" >/dev/null 2>"$S/logs/gvisor-control.log"; then
		gvisor_fail "control: the escape check found no host process of native sandbox $nid, whose processes are the host's: it cannot see"
	fi
	grep -q "host process [0-9]* runs the sandbox's" "$S/logs/gvisor-control.log" ||
		gvisor_fail "control: the escape check on native sandbox $nid failed otherwise: $(tail -n 2 "$S/logs/gvisor-control.log")"
	"$S/kube-e2e" drive kill -url "$url" -key "$key" -state "$S/drive-control.json" || gvisor_fail "kill of control sandbox $nid failed"
	log "control: in native sandbox $nid the same check sees the sandbox's process on the host ($(grep -o 'host processes with its marker: [0-9]* of [0-9]*' "$S/logs/gvisor-control.log"))"
	log "gVisor leg: PASS ($(($(date +%s) - t0))s)"
	GV_POD=
}
