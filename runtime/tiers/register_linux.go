package tiers

import (
	"airlock/runtime/gvisor"
	"airlock/runtime/microvm"
	"airlock/runtime/tier"
)

func init() {
	tier.Register(Native{})
	tier.Register(Wasm{})
	tier.Register(gvisor.Tier{})
	tier.Register(microvm.Tier{})
}
