package native

import "os"

// AIRLOCK_TEST_BREAK=seccomp|landlock runs the tests with that layer off, to
// demonstrate that the hostile tests fail when a defence is missing.
func init() { testBreak = os.Getenv("AIRLOCK_TEST_BREAK") }
