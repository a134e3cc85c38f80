package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/airlock-dev/airlock/approval"
	"github.com/airlock-dev/airlock/client"
	"github.com/airlock-dev/airlock/e2b"
	"github.com/airlock-dev/airlock/store"
)

const keysUsage = `usage:
  airlock keys create --name NAME [--admin] [--max-sandboxes N] [--max-memory SIZE] [--max-cpus N]
                      [--max-pids N] [--max-disk SIZE] [--max-timeout DURATION] [--approval-policy FILE] [--e2b]
                      (--state-dir DIR | --url URL)
  airlock keys list (--state-dir DIR | --url URL)
  airlock keys revoke (--state-dir DIR | --url URL) KEY_ID
  airlock keys limits [--max-sandboxes N] [--max-memory SIZE] [--max-cpus N] [--max-pids N]
                      [--max-disk SIZE] [--max-timeout DURATION] (--state-dir DIR | --url URL) KEY_ID

With --state-dir the keys are those of the server's state directory, or
with --database-url (or $AIRLOCK_DATABASE_URL) those of the servers sharing
that PostgreSQL database (airlock serve --database-url). Without
--state-dir, --url (or $AIRLOCK_URL) names a running server and --api-key
(or $AIRLOCK_API_KEY) one of its admin keys: the keys are managed through
its /v1/keys endpoints (docs/api.md). --approval-policy needs --state-dir.

--max-sandboxes 0 (the default) gives a key no cap of its own: only the
server's --max-sandboxes applies to it. limits replaces the key's whole set
(a flag left out: no cap of its own). A revoked key is refused (401) from
its next request on, by a server that is already running too.
--approval-policy adds the key's own approval rules to the server's
(docs/approvals.md). --admin makes a key that may manage every key through
the server (GET/POST /v1/keys, DELETE /v1/keys/ID, PUT /v1/keys/ID/limits;
docs/api.md); the last live admin key cannot be revoked.
`

func init() { hidden["keys"] = cmdKeys }

// keysOpts are the parsed flags of airlock keys.
type keysOpts struct {
	sub, name, approvalFile string
	maxSB                   int
	limits                  store.KeyLimits
	admin, e2bForm          bool
	args                    []string
}

// cmdKeys manages API keys: in a server's state directory (or shared
// database), or through a running server's admin endpoints.
func cmdKeys(args []string) int {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, keysUsage)
		return exitUsage
	}
	sub, args := args[0], args[1:]
	if sub == "-h" || sub == "-help" || sub == "--help" || sub == "help" {
		fmt.Print(keysUsage)
		return 0
	}
	fs := flag.NewFlagSet("keys "+sub, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	stateDir := fs.String("state-dir", "", "the server's state directory (local mode)")
	dbURL := databaseURLFlag(fs)
	serverURL := fs.String("url", "", "a running server's URL (server mode; default $AIRLOCK_URL when --state-dir is not given)")
	apiKey := fs.String("api-key", "", "an admin API key of that server (default $AIRLOCK_API_KEY)")
	o := keysOpts{sub: sub}
	fs.StringVar(&o.name, "name", "", "a label for the key (create)")
	fs.IntVar(&o.maxSB, "max-sandboxes", 0, "sandboxes the key may have running at once; 0 means only the server's limit (create, limits)")
	var cf ceilingFlags
	cf.register(fs, "only the server's ceiling (create, limits)")
	maxTimeout := fs.Duration("max-timeout", 0, "largest sandbox TTL the key may ask for, e.g. 1h (0: only the server's --max-timeout) (create, limits)")
	fs.StringVar(&o.approvalFile, "approval-policy", "", "JSON or YAML file of the key's own approval rules, added to the server's (docs/approvals.md) (create, --state-dir only)")
	fs.BoolVar(&o.admin, "admin", false, "make an admin key, which may manage every key through the server's /v1/keys (create)")
	fs.BoolVar(&o.e2bForm, "e2b", false, "print the key as e2b_ and hex, the form E2B SDKs accept with key validation on; the E2B endpoints accept either form (create)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Print(keysUsage)
			return 0
		}
		fmt.Fprintf(os.Stderr, "airlock keys %s: %v\n%s", sub, suggestFlag(fs, err), keysUsage)
		return exitUsage
	}
	o.limits, o.args = cf.keyLimits(*maxTimeout), fs.Args()
	switch sub {
	case "create", "list", "revoke", "limits":
	default:
		fmt.Fprintf(os.Stderr, "airlock keys: unknown subcommand %q\n%s", sub, keysUsage)
		return exitUsage
	}
	if want := map[string]int{"create": 0, "list": 0, "revoke": 1, "limits": 1}[sub]; len(o.args) != want {
		fmt.Fprintf(os.Stderr, "airlock keys %s: want %d KEY_ID argument(s), got %d\n", sub, want, len(o.args))
		return exitUsage
	}
	if sub == "create" && o.name == "" {
		fmt.Fprintln(os.Stderr, "airlock keys create: --name is required")
		return exitUsage
	}
	if *stateDir == "" && (*serverURL != "" || os.Getenv("AIRLOCK_URL") != "") {
		if o.approvalFile != "" || *dbURL != "" {
			fmt.Fprintf(os.Stderr, "airlock keys %s: --approval-policy and --database-url need --state-dir (the server's API does not take them)\n", sub)
			return exitUsage
		}
		c, err := client.Config{URL: *serverURL, APIKey: *apiKey}.WithEnv().New()
		if err != nil {
			fmt.Fprintf(os.Stderr, "airlock keys %s: %v\n", sub, strings.TrimPrefix(err.Error(), "airlock: "))
			return exitUsage
		}
		return keysRemote(c, o)
	}
	if *stateDir == "" {
		fmt.Fprintf(os.Stderr, "airlock keys %s: --state-dir DIR (the server's state directory) or --url URL (a running server, with an admin key) is required\n", sub)
		return exitUsage
	}
	if *serverURL != "" {
		fmt.Fprintf(os.Stderr, "airlock keys %s: give --state-dir or --url, not both\n", sub)
		return exitUsage
	}
	st, err := openStore(*stateDir, *dbURL)
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock keys: %v\n", err)
		return 1
	}
	defer st.Close()
	return keysLocal(st, *stateDir, o)
}

// keysLocal runs a keys verb on the state directory's store.
func keysLocal(st *store.Store, stateDir string, o keysOpts) int {
	ctx := context.Background()
	switch o.sub {
	case "create":
		var approvalPolicy []byte
		var err error
		if o.approvalFile != "" {
			if approvalPolicy, err = os.ReadFile(o.approvalFile); err == nil {
				_, err = approval.Parse(approvalPolicy)
			}
			if err != nil {
				fmt.Fprintf(os.Stderr, "airlock keys create: --approval-policy: %v\n", err)
				return exitUsage
			}
		}
		k, secret, err := st.CreateKeySpec(ctx, store.KeySpec{Name: o.name, MaxSandboxes: o.maxSB, Limits: o.limits, Admin: o.admin})
		if err != nil {
			fmt.Fprintf(os.Stderr, "airlock keys create: %v\n", err)
			return 1
		}
		if approvalPolicy != nil {
			if err := saveKeyPolicy(ctx, st, stateDir, k.ID, approvalPolicy); err != nil {
				// Fail closed: a key without the policy it was meant to have
				// must not be handed out.
				st.RevokeKey(ctx, k.ID)
				fmt.Fprintf(os.Stderr, "airlock keys create: %v (key %s revoked)\n", err, k.ID)
				return 1
			}
		}
		return printSecret(k.ID, k.Name, secret, o.e2bForm)
	case "list":
		keys, err := st.ListKeys(ctx)
		if err != nil {
			fmt.Fprintf(os.Stderr, "airlock keys list: %v\n", err)
			return 1
		}
		rows := make([]client.Key, len(keys))
		for i, k := range keys {
			rows[i] = client.Key{ID: k.ID, Name: k.Name, CreatedAt: k.CreatedAt, RevokedAt: k.RevokedAt, MaxSandboxes: k.MaxSandboxes,
				Limits: client.KeyLimits(k.Limits), Admin: k.Admin, LastUsedAt: k.LastUsedAt}
		}
		printKeys(rows)
	case "revoke":
		if err := st.RevokeKey(ctx, o.args[0]); err != nil {
			fmt.Fprintf(os.Stderr, "airlock keys revoke: %v\n", err)
			return 1
		}
		fmt.Fprintf(os.Stderr, "revoked %s\n", o.args[0])
	case "limits":
		k, err := st.SetKeyLimits(ctx, o.args[0], o.maxSB, o.limits)
		if err != nil {
			fmt.Fprintf(os.Stderr, "airlock keys limits: %v\n", err)
			return 1
		}
		fmt.Fprintf(os.Stderr, "key %s: max sandboxes %d, limits %s\n", k.ID, k.MaxSandboxes, keyLimitsText(k.Limits))
	}
	return 0
}

// keysRemote runs a keys verb through a server's admin endpoints.
func keysRemote(c *client.Client, o keysOpts) int {
	ctx := context.Background()
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "airlock keys %s: %s\n", o.sub, strings.TrimPrefix(err.Error(), "airlock: "))
		return 1
	}
	switch o.sub {
	case "create":
		k, err := c.CreateKey(ctx, client.CreateKeyRequest{Name: o.name, MaxSandboxes: o.maxSB, Limits: client.KeyLimits(o.limits), Admin: o.admin})
		if err != nil {
			return fail(err)
		}
		return printSecret(k.Key.ID, k.Key.Name, k.Secret, o.e2bForm)
	case "list":
		keys, err := c.Keys(ctx)
		if err != nil {
			return fail(err)
		}
		printKeys(keys)
	case "revoke":
		if _, err := c.RevokeKey(ctx, o.args[0]); err != nil {
			return fail(err)
		}
		fmt.Fprintf(os.Stderr, "revoked %s\n", o.args[0])
	case "limits":
		k, err := c.SetKeyLimits(ctx, o.args[0], o.maxSB, client.KeyLimits(o.limits))
		if err != nil {
			return fail(err)
		}
		fmt.Fprintf(os.Stderr, "key %s: max sandboxes %d, limits %s\n", k.ID, k.MaxSandboxes, keyLimitsText(store.KeyLimits(k.Limits)))
	}
	return 0
}

// printSecret shows a new key's secret (on stdout, alone) once.
func printSecret(id, name, secret string, e2bForm bool) int {
	if e2bForm {
		var err error
		if secret, err = e2b.E2BKey(secret); err != nil {
			fmt.Fprintf(os.Stderr, "airlock keys create: %v\n", err)
			return 1
		}
	}
	fmt.Fprintf(os.Stderr, "created key %s (%s); the secret below is shown once and cannot be recovered\n", id, name)
	fmt.Println(secret)
	return 0
}

// printKeys is keys list's table.
func printKeys(keys []client.Key) {
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tCREATED\tMAX_SANDBOXES\tREVOKED\tLIMITS\tADMIN\tLAST_USED")
	for _, k := range keys {
		rev := "-"
		if k.RevokedAt != nil {
			rev = k.RevokedAt.Format(time.RFC3339)
		}
		limit := strconv.Itoa(k.MaxSandboxes)
		if k.MaxSandboxes == 0 {
			limit = "0 (no own cap: the server's --max-sandboxes)"
		}
		used := "-"
		if k.LastUsedAt != nil {
			used = k.LastUsedAt.Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", k.ID, k.Name, k.CreatedAt.Format(time.RFC3339), limit, rev,
			keyLimitsText(store.KeyLimits(k.Limits)), yesNo(k.Admin), used)
	}
	tw.Flush()
}

// yesNo shows a flag in a table.
func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
