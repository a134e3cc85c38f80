package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/airlock-dev/airlock/approval"
	"github.com/airlock-dev/airlock/e2b"
	"github.com/airlock-dev/airlock/store"
)

const keysUsage = `usage:
  airlock keys create --name NAME [--max-sandboxes N] [--max-memory SIZE] [--max-cpus N]
                      [--max-pids N] [--max-disk SIZE] [--max-timeout DURATION] [--approval-policy FILE] [--e2b] [--admin]
                      --state-dir DIR
  airlock keys list --state-dir DIR
  airlock keys revoke --state-dir DIR KEY_ID

With --database-url (or $AIRLOCK_DATABASE_URL) the keys are those of the
servers sharing that PostgreSQL database (airlock serve --database-url).

--max-sandboxes 0 (the default) gives a key no cap of its own: only the
server's --max-sandboxes applies to it. A revoked key is refused (401) from
its next request on, by a server that is already running too.
--approval-policy adds the key's own approval rules to the server's
(docs/approvals.md). --admin makes a key that may manage every key through
the server (GET/POST /v1/keys, DELETE /v1/keys/ID, PUT /v1/keys/ID/limits;
docs/api.md); the last live admin key cannot be revoked.
`

func init() { hidden["keys"] = cmdKeys }

// cmdKeys manages API keys in a server's state directory.
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
	stateDir := fs.String("state-dir", "", "the server's state directory (required)")
	dbURL := databaseURLFlag(fs)
	name := fs.String("name", "", "a label for the key (create)")
	maxSB := fs.Int("max-sandboxes", 0, "sandboxes the key may have running at once; 0 means only the server's limit (create)")
	var cf ceilingFlags
	cf.register(fs, "only the server's ceiling (create)")
	maxTimeout := fs.Duration("max-timeout", 0, "largest sandbox TTL the key may ask for, e.g. 1h (0: only the server's --max-timeout) (create)")
	approvalFile := fs.String("approval-policy", "", "JSON or YAML file of the key's own approval rules, added to the server's (docs/approvals.md) (create)")
	admin := fs.Bool("admin", false, "make an admin key, which may manage every key through the server's /v1/keys (create)")
	e2bForm := fs.Bool("e2b", false, "print the key as e2b_ and hex, the form E2B SDKs accept with key validation on; the E2B endpoints accept either form (create)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Print(keysUsage)
			return 0
		}
		fmt.Fprintf(os.Stderr, "airlock keys %s: %v\n%s", sub, suggestFlag(fs, err), keysUsage)
		return exitUsage
	}
	if *stateDir == "" {
		fmt.Fprintf(os.Stderr, "airlock keys %s: --state-dir is required\n", sub)
		return exitUsage
	}
	st, err := openStore(*stateDir, *dbURL)
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock keys: %v\n", err)
		return 1
	}
	defer st.Close()
	ctx := context.Background()
	switch sub {
	case "create":
		if *name == "" {
			fmt.Fprintln(os.Stderr, "airlock keys create: --name is required")
			return exitUsage
		}
		var approvalPolicy []byte
		if *approvalFile != "" {
			if approvalPolicy, err = os.ReadFile(*approvalFile); err == nil {
				_, err = approval.Parse(approvalPolicy)
			}
			if err != nil {
				fmt.Fprintf(os.Stderr, "airlock keys create: --approval-policy: %v\n", err)
				return exitUsage
			}
		}
		k, secret, err := st.CreateKeySpec(ctx, store.KeySpec{Name: *name, MaxSandboxes: *maxSB, Limits: cf.keyLimits(*maxTimeout), Admin: *admin})
		if err != nil {
			fmt.Fprintf(os.Stderr, "airlock keys create: %v\n", err)
			return 1
		}
		if approvalPolicy != nil {
			if err := saveKeyPolicy(ctx, st, *stateDir, k.ID, approvalPolicy); err != nil {
				// Fail closed: a key without the policy it was meant to have
				// must not be handed out.
				st.RevokeKey(ctx, k.ID)
				fmt.Fprintf(os.Stderr, "airlock keys create: %v (key %s revoked)\n", err, k.ID)
				return 1
			}
		}
		if *e2bForm {
			if secret, err = e2b.E2BKey(secret); err != nil {
				fmt.Fprintf(os.Stderr, "airlock keys create: %v\n", err)
				return 1
			}
		}
		fmt.Fprintf(os.Stderr, "created key %s (%s); the secret below is shown once and cannot be recovered\n", k.ID, k.Name)
		fmt.Println(secret)
	case "list":
		keys, err := st.ListKeys(ctx)
		if err != nil {
			fmt.Fprintf(os.Stderr, "airlock keys list: %v\n", err)
			return 1
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tNAME\tCREATED\tADMIN\tMAX_SANDBOXES\tREVOKED\tLIMITS")
		for _, k := range keys {
			rev := "-"
			if k.RevokedAt != nil {
				rev = k.RevokedAt.Format(time.RFC3339)
			}
			limit := strconv.Itoa(k.MaxSandboxes)
			if k.MaxSandboxes == 0 {
				limit = "0 (no own cap: the server's --max-sandboxes)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", k.ID, k.Name, k.CreatedAt.Format(time.RFC3339), yesNo(k.Admin), limit, rev, keyLimitsText(k.Limits))
		}
		tw.Flush()
	case "revoke":
		if fs.NArg() != 1 {
			fmt.Fprintln(os.Stderr, "airlock keys revoke: want exactly one KEY_ID")
			return exitUsage
		}
		if err := st.RevokeKey(ctx, fs.Arg(0)); err != nil {
			fmt.Fprintf(os.Stderr, "airlock keys revoke: %v\n", err)
			return 1
		}
		fmt.Fprintf(os.Stderr, "revoked %s\n", fs.Arg(0))
	default:
		fmt.Fprintf(os.Stderr, "airlock keys: unknown subcommand %q\n%s", sub, keysUsage)
		return exitUsage
	}
	return 0
}

// yesNo shows a flag in a table.
func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
