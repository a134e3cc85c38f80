package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"

	"github.com/airlock-dev/airlock/approval"
	"github.com/airlock-dev/airlock/store"
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

// saveKeyPolicy stores an API key's own approval policy where the servers
// read it (keyPolicies): with the key in a shared database, so every server
// applies it, or in the state directory.
func saveKeyPolicy(ctx context.Context, st *store.Store, stateDir, keyID string, data []byte) error {
	if st.SharedDatabase() == "" {
		return approval.SaveKeyPolicy(stateDir, keyID, data)
	}
	p, err := approval.Parse(data)
	if err != nil {
		return err
	}
	j, err := json.Marshal(p)
	if err != nil {
		return fmt.Errorf("approval policy of %s: %w", keyID, err)
	}
	return st.SetKeyApprovalPolicy(ctx, keyID, j)
}

// keyPolicies returns the server's approval.Config.KeyPolicy: the policies
// saveKeyPolicy stored. An unreadable one is an error, so the action is
// refused.
func keyPolicies(st *store.Store, stateDir string) func(context.Context, string) (*approval.Policy, error) {
	if st.SharedDatabase() == "" {
		return approval.KeyPolicies(stateDir)
	}
	return func(ctx context.Context, keyID string) (*approval.Policy, error) {
		if keyID == "" {
			return nil, nil // no key (--no-auth): no key policy
		}
		raw, err := st.KeyApprovalPolicy(ctx, keyID)
		if err != nil || raw == nil {
			return nil, err
		}
		return approval.Parse(raw)
	}
}
