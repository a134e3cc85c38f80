package tiers

import (
	"github.com/airlock-dev/airlock/runtime/gvisor"
	"github.com/airlock-dev/airlock/runtime/microvm"
	"github.com/airlock-dev/airlock/runtime/tier"
)

func init() {
	tier.Register(Native{})
	tier.Register(Wasm{})
	tier.Register(gvisor.Tier{})
	tier.Register(microvm.Tier{})
}
