package template_test

// The built-in tiers, as cmd/airlock registers them.
import _ "airlock/runtime/tiers"
