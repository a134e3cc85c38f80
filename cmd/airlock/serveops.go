package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/airlock-dev/airlock/internal/certreload"
	"github.com/airlock-dev/airlock/internal/config"
)

// opsFlags are serve's operator flags: the config file, the TLS listener
// and the log's format and level (docs/operations.md).
type opsFlags struct {
	config, tlsCert, tlsKey, logFormat, logLevel string
}

func (o *opsFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&o.config, "config", "", "TOML file of serve's flags (keys are the flag names: listen = \"0.0.0.0:7443\"); flags given here override it. Default: "+config.DefaultPath+" if it exists; --config '' reads none")
	fs.StringVar(&o.tlsCert, "tls-cert", "", "serve HTTPS with this PEM certificate (chain) file; needs --tls-key; SIGHUP reads both files again")
	fs.StringVar(&o.tlsKey, "tls-key", "", "PEM private key of --tls-cert")
	fs.StringVar(&o.logFormat, "log-format", "text", "log line format: text (key=value) or json; every line of the server's log has it")
	fs.StringVar(&o.logLevel, "log-level", "info", "least severe log level written: debug, info, warn or error (debug adds /healthz and /metrics requests)")
}

// applyConfig sets the flags the config file names and the command line
// did not (fs is parsed): --config's file, or else defaultPath if it
// exists (config.DefaultPath in serve). It returns the file read, "" if
// none.
func (o *opsFlags) applyConfig(fs *flag.FlagSet, defaultPath string) (string, error) {
	path, given := o.config, false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == "config" })
	if !given {
		if _, err := os.Stat(defaultPath); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return "", nil
			}
			return "", fmt.Errorf("config: %w", err)
		}
		path = defaultPath
	}
	if path == "" {
		return "", nil
	}
	_, err := config.Apply(fs, path, config.Options{Reserved: []string{"config"}, Repeatable: func(f *flag.Flag) bool {
		switch f.Value.(type) {
		case *stringList, *listFlag:
			return true
		}
		return false
	}})
	return path, err
}

// logger is the server's one logger, in the format and from the level
// asked.
func (o *opsFlags) logger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level %q: give debug, info, warn or error", o.logLevel)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch strings.ToLower(o.logFormat) {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: give text or json", o.logFormat)
}

// tls reads the TLS pair, nil if TLS is off. Half a pair is refused: a
// server an operator meant to be HTTPS never starts as plain HTTP.
func (o *opsFlags) tls() (*certreload.Reloader, error) {
	switch {
	case o.tlsCert == "" && o.tlsKey == "":
		return nil, nil
	case o.tlsCert == "":
		return nil, errors.New("--tls-key needs --tls-cert: refusing to serve half-configured TLS")
	case o.tlsKey == "":
		return nil, errors.New("--tls-cert needs --tls-key: refusing to serve half-configured TLS")
	}
	return certreload.New(o.tlsCert, o.tlsKey)
}

// reloadOnHUP reads the TLS pair again on each SIGHUP until stop is
// closed; a pair that fails to load is logged and the old one kept.
func reloadOnHUP(r *certreload.Reloader, log *slog.Logger, stop <-chan struct{}) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		defer signal.Stop(hup)
		for {
			select {
			case <-stop:
				return
			case <-hup:
				if err := r.Reload(); err != nil {
					log.Error("TLS certificate reload failed; still serving the previous one", "err", err)
					continue
				}
				log.Info("TLS certificate reloaded", "subject", r.Leaf().Subject.String(), "not_after", r.Leaf().NotAfter)
			}
		}
	}()
}
