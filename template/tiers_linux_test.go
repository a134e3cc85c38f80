package template_test

// The built-in tiers, as cmd/airlock registers them.
import _ "github.com/airlock-dev/airlock/runtime/tiers"
