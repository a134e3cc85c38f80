// Step helpers shared by the scenarios of tests/js: each step asserts its
// result; a failure is a StepError naming what differed, and `progress`
// names the step running, for the scenario's final FAIL line.

export class StepError extends Error {}

export const progress = { current: '(setup)' }

export function assert(cond, msg) {
  if (!cond) throw new StepError(msg)
}

export function eq(got, want, what) {
  const g = JSON.stringify(got)
  const w = JSON.stringify(want)
  if (g !== w) throw new StepError(`${what}: got ${g}, want ${w}`)
}

// step runs fn as the step called name and logs how long it took.
export async function step(name, fn) {
  progress.current = name
  const t0 = Date.now()
  await fn()
  console.log(`ok   ${name} (${Date.now() - t0} ms)`)
}
