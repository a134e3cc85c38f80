package main

import (
	"flag"
	"os"

	"airlock/store"
)

// databaseEnv names the environment variable --database-url defaults to.
// The environment is the place for a URL with a password: a command line
// is readable by every user of the host (/proc/PID/cmdline).
const databaseEnv = "AIRLOCK_DATABASE_URL"

// databaseURLFlag registers --database-url. Its default is not shown in
// -h (it may hold a password): openStore falls back to $AIRLOCK_DATABASE_URL.
func databaseURLFlag(fs *flag.FlagSet) *string {
	return fs.String("database-url", "", "PostgreSQL URL (postgres://USER:PASSWORD@HOST:PORT/DB?sslmode=...) of the API keys, audit log and network log shared by several servers; default $"+databaseEnv+"; unset: the state directory's SQLite database")
}

// openStore opens the state directory's store with the shared tables in
// PostgreSQL when a database URL is given (flag, then environment).
func openStore(stateDir, databaseURL string) (*store.Store, error) {
	if databaseURL == "" {
		databaseURL = os.Getenv(databaseEnv)
	}
	return store.OpenOptions(stateDir, store.Options{DatabaseURL: databaseURL})
}
