//go:build !linux

package bench

import "time"

// AirlockCLI returns the airlock peer; airlock sandboxes need Linux.
func AirlockCLI(exe string, timeout time.Duration) Peer {
	return Peer{Name: Reference, Missing: "airlock sandboxes need Linux"}
}

// AirlockInProcess returns the in-process airlock peer; airlock sandboxes
// need Linux.
func AirlockInProcess() Peer {
	return Peer{Name: Reference, Missing: "airlock sandboxes need Linux"}
}

// AirlockNativeIdle returns the airlock-sleep density peer; airlock
// sandboxes need Linux.
func AirlockNativeIdle() Peer {
	return Peer{Name: "airlock-sleep", Missing: "airlock sandboxes need Linux"}
}
