// Command kube-e2e is the Go side of scripts/kubernetes-e2e.sh.
//
//	kube-e2e image -kind agent   -ref localhost/airlock-agent:e2e -airlock ./airlock -out agent.tar
//	kube-e2e image -kind sandbox -ref localhost/airlock-sandbox:e2e -out sandbox.tar
//	kube-e2e image -kind pause   -ref localhost/pause:e2e -out pause.tar
//
// image builds the container images the script imports into the node's
// containerd: tarballs (docker save format, which `ctr images import` reads)
// made from files of this host, so the test needs no registry. agent: the
// static airlock binary at /airlock (the image the pod's init container copies
// the agent from). sandbox: Debian's static busybox as /bin/sh and its
// applets, and this host's python3 with its standard library and every shared
// library it and its extension modules load, plus /etc/passwd, /tmp and a
// home for uid 1000. pause: busybox sleeping, for containerd's pod sandbox
// container (so no pause image is pulled). Layers are written with fixed
// times, owners and order, so the same inputs give the same image digest and
// a re-import is a no-op.
//
//	kube-e2e drive create -url URL -state FILE   # prints the sandbox id
//	kube-e2e drive after  -url URL2 -state FILE
//	kube-e2e drive kill   -url URL2 -state FILE
//	kube-e2e drive egress -url URL
//
// drive is a real client of airlock's HTTP API (package github.com/airlock-dev/airlock/client):
// create makes a sandbox and checks exec output, a file written and read
// back and a Python cell; after checks, through another replica, that the
// sandbox, the file and the Python variable survived the first replica's
// death; kill ends the sandbox and waits until the API says so; egress
// checks a sandbox's allowlist and injected header through the cluster
// egress proxy (egress.go).
//
//	kube-e2e pooled ca     -state FILE -out DIR
//	kube-e2e pooled enroll -state FILE -addr IP:7070
//
// pooled checks a warm pool's agent (--pool-ca) in a real pod (pooled.go).
//
//	kube-e2e escape -url URL -key KEY -id ID -probe FILE -secret FILE
//
// escape runs the syscall probe in sandbox ID and counts escapes (escape.go).
//
//	kube-e2e claimlat -kubeconfig FILE -namespace NS -pool POOL -n N
//
// claimlat times agent-sandbox's controller alone handing SandboxClaims
// warm Sandboxes (claimlat.go): the floor under a pooled create.
//
//	kube-e2e spans -log FILE
//
// spans prints the phases of the pooled creates a server logged at debug
// level (spans.go): p50 and p99 of each.
package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: kube-e2e image|drive|pooled|escape|claimlat|spans [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "image":
		err = cmdImage(os.Args[2:])
	case "drive":
		err = cmdDrive(os.Args[2:])
	case "pooled":
		err = cmdPooled(os.Args[2:])
	case "escape":
		err = cmdEscape(os.Args[2:])
	case "claimlat":
		err = cmdClaimLat(os.Args[2:])
	case "spans":
		err = cmdSpans(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q (image, drive, pooled, escape, claimlat, spans)", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kube-e2e:", err)
		os.Exit(1)
	}
}
