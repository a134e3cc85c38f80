package native

import (
	"io"
	"os"
	"sync"
	"time"
)

// RunIO is the host side of a one-shot run's stdio: stdout and stderr come
// through pipes and are counted against the output limit (and kept, capped,
// when captured); stdin is a file passed as is, or copied into a pipe.
// Run uses it, and so do other runtimes' run loops (runtime/gvisor).
type RunIO struct {
	opts                             RunOptions
	sink                             *limitedSink
	inR, inW, outR, outW, errR, errW *os.File
	wg                               sync.WaitGroup
}

// NewRunIO opens the pipes for a run with options opts whose output may
// reach limit bytes.
func NewRunIO(opts RunOptions, limit int64) (*RunIO, error) {
	r := &RunIO{opts: opts, sink: &limitedSink{limit: limit, capture: opts.Capture}}
	if opts.PTY != nil {
		// One stream: the terminal. The master is read as stdout.
		r.outR, r.outW = opts.PTY.Master, opts.PTY.Slave
		return r, nil
	}
	var err error
	if r.outR, r.outW, err = os.Pipe(); err != nil {
		return nil, err
	}
	if r.errR, r.errW, err = os.Pipe(); err != nil {
		r.closeAll()
		return nil, err
	}
	switch f := opts.Stdin.(type) {
	case nil:
	case *os.File:
		r.inR = f
	default:
		if r.inR, r.inW, err = os.Pipe(); err != nil {
			r.closeAll()
			return nil, err
		}
	}
	return r, nil
}

// SandboxEnds returns the descriptors for the sandbox's stdin (nil means
// /dev/null), stdout and stderr.
func (r *RunIO) SandboxEnds() (stdin, stdout, stderr *os.File) {
	if r.opts.PTY != nil {
		return r.outW, r.outW, r.outW
	}
	return r.inR, r.outW, r.errW
}

// Started closes this process's copies of the sandbox's ends once the
// sandbox holds its own; when the sandbox did not start (ok false) it
// closes everything.
func (r *RunIO) Started(ok bool) {
	r.outW.Close()
	if r.opts.PTY != nil {
		if !ok {
			r.outR.Close()
		}
		return
	}
	r.errW.Close()
	if r.inW != nil {
		r.inR.Close()
	}
	if !ok {
		r.closeAll()
	}
}

func (r *RunIO) closeAll() {
	for _, f := range []*os.File{r.outR, r.outW, r.errR, r.errW} {
		if f != nil {
			f.Close()
		}
	}
	if r.inW != nil {
		r.inR.Close()
		r.inW.Close()
	}
}

// Pump starts copying output to opts.Stdout and opts.Stderr and input from
// opts.Stdin. onOver is called once, when the output first passes the limit.
func (r *RunIO) Pump(onOver func()) {
	r.sink.onOver = onOver
	if r.opts.PTY != nil {
		// The master reads EIO once every holder of the slave is gone.
		r.wg.Add(1)
		go r.sink.pump(0, r.outR, r.opts.Stdout, &r.wg)
		if r.opts.Stdin != nil {
			go io.Copy(r.outR, r.opts.Stdin)
		}
		return
	}
	r.wg.Add(2)
	go r.sink.pump(0, r.outR, r.opts.Stdout, &r.wg)
	go r.sink.pump(1, r.errR, r.opts.Stderr, &r.wg)
	if r.inW != nil {
		go func() {
			_, _ = io.Copy(r.inW, r.opts.Stdin)
			r.inW.Close()
		}()
	}
}

// Wait waits for stdout and stderr to reach end of file (every process
// holding them has exited) and closes stdin.
func (r *RunIO) Wait() {
	r.wg.Wait()
	if r.inW != nil {
		r.inW.Close()
	}
}

// Output returns the captured stdout and stderr and whether the output
// passed the limit. Call it after Wait.
func (r *RunIO) Output() (stdout, stderr string, truncated bool) {
	return r.sink.bufs[0].String(), r.sink.bufs[1].String(), r.sink.over
}

// SetupResult is the Result of a run whose sandbox could not be built
// (exit code 127 or 126 for a missing or non-executable command).
func SetupResult(start time.Time, err error) *Result { return setupResult(start, err) }
