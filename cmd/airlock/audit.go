package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/airlock-dev/airlock/server"
)

func init() { hidden["audit"] = cmdAudit }

const auditUsage = `usage: airlock audit --state-dir DIR [--sandbox ID] [--key KEY_ID] [--action A]
                     [--since T] [--until T] [--before ID] [--limit N] [--json]

Prints the audit log of a server's state directory, newest first: every
sandbox create and kill, exec, code cell, file write/remove/move and network
policy change, with the API key that made it. Reading the state directory
shows every key's events; through the API (GET /v1/audit) a key sees its own.
Times are RFC 3339 (2026-01-02T15:04:05Z). With more events than --limit,
the last line says which --before gives the next page. With --database-url
(or $AIRLOCK_DATABASE_URL) it is the log shared by the servers using that
PostgreSQL database.

`

// cmdAudit prints the audit log.
func cmdAudit(args []string) int {
	fs := flag.NewFlagSet("audit", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	stateDir := fs.String("state-dir", "", "the server's state directory (required)")
	dbURL := databaseURLFlag(fs)
	asJSON := fs.Bool("json", false, "print the page as JSON, as GET /v1/audit answers")
	q := map[string][]string{}
	for _, name := range []string{"sandbox", "key", "action", "since", "until", "before", "limit"} {
		help := map[string]string{"sandbox": "only events about this sandbox", "key": "only events made with this API key id",
			"action": "only this action (exec, code, file.write, sandbox.kill, ...)", "since": "only events at or after this time",
			"until": "only events before this time", "before": "only events older than this event id (paging)",
			"limit": "at most this many events, 1 to 1000 (default 100)"}[name]
		fs.Func(name, help, func(v string) error { q[name] = []string{v}; return nil })
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(os.Stdout)
			fmt.Print(auditUsage)
			fs.PrintDefaults()
			return 0
		}
		fmt.Fprintf(os.Stderr, "airlock audit: %v\n%s", suggestFlag(fs, err), auditUsage)
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "airlock audit: unexpected argument %q\n", fs.Arg(0))
		return exitUsage
	}
	if *stateDir == "" {
		fmt.Fprintln(os.Stderr, "airlock audit: --state-dir is required")
		return exitUsage
	}
	f, err := server.ParseAuditQuery(q)
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock audit: %v\n", err)
		return exitUsage
	}
	if _, err := os.Stat(*stateDir); err != nil {
		fmt.Fprintf(os.Stderr, "airlock audit: %v\n", err)
		return 1
	}
	st, err := openStore(*stateDir, *dbURL)
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock audit: %v\n", err)
		return 1
	}
	defer st.Close()
	evs, err := st.AuditLog(context.Background(), f)
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock audit: %v\n", err)
		return 1
	}
	page := server.NewAuditPage(evs, f.Limit)
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		enc.Encode(page)
		return 0
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tTIME\tACTION\tSANDBOX\tKEY\tDETAIL")
	dash := func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	}
	for _, e := range page.Events {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", e.ID, e.Time.Format(time.RFC3339), e.Action, dash(e.SandboxID), dash(e.KeyID), e.Detail)
	}
	tw.Flush()
	if page.Next != 0 {
		fmt.Printf("more: airlock audit --before %s ...\n", strconv.FormatInt(page.Next, 10))
	}
	return 0
}
