package interp_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/interp"
)

func TestMainResult(t *testing.T) {
	t.Parallel()
	needModules(t, "matplotlib")
	k := python(t)
	var mains []string
	res, err := k.Execute(context.Background(), `import matplotlib.pyplot as plt
display("shown")
plt.plot([1, 2])
"value"`, 0, 0, func(o interp.Output) {
		if o.Type == "result" && o.Main {
			mains = append(mains, o.Text)
		}
	})
	if err != nil || res.Error != nil {
		t.Fatalf("%v %v", err, res.Error)
	}
	// display's result, the value, the figure left open.
	if len(res.Results) != 3 || res.MainResult != 1 || res.Results[1]["text/plain"] != "'value'" {
		t.Fatalf("results %v, main %d", keys(res.Results), res.MainResult)
	}
	if strings.Join(mains, ",") != "'value'" {
		t.Errorf("outputs marked main: %q", mains)
	}
	for _, code := range []string{"x = 1", "None", "print(1)", "display(1)", "1/0"} {
		if res := run(t, k, code, 0); res.MainResult != -1 {
			t.Errorf("%q: MainResult %d, want -1", code, res.MainResult)
		}
	}
	j := javascript(t)
	if res := ok(t, j, "1 + 1"); res.MainResult != 0 {
		t.Errorf("javascript: MainResult %d, want 0", res.MainResult)
	}
	if res := ok(t, j, "let q = 1"); res.MainResult != -1 {
		t.Errorf("javascript statement: MainResult %d, want -1", res.MainResult)
	}
}

func TestCellEnv(t *testing.T) {
	t.Parallel()
	env := map[string]string{"AIRLOCK_CELL_VAR": "it's a \"value\"\n$HOME", "AIRLOCK_OTHER": "2"}
	for _, tc := range []struct {
		lang              interp.Language
		show, child, gone string
	}{
		{interp.Python,
			"import os, subprocess\nprint(os.environ['AIRLOCK_CELL_VAR'])",
			"print(subprocess.run(['printenv', 'AIRLOCK_OTHER'], capture_output=True, text=True).stdout, end='')",
			"print(os.environ.get('AIRLOCK_CELL_VAR', 'unset'), os.environ.get('HOME_BEFORE', 'unset'))"},
		{interp.JavaScript,
			"console.log(process.env.AIRLOCK_CELL_VAR)",
			"process.stdout.write(require('child_process').execSync('printenv AIRLOCK_OTHER').toString())",
			"console.log(process.env.AIRLOCK_CELL_VAR ?? 'unset', process.env.HOME_BEFORE ?? 'unset')"},
		{interp.Bash,
			"printf '%s\\n' \"$AIRLOCK_CELL_VAR\"",
			"printenv AIRLOCK_OTHER",
			"echo \"${AIRLOCK_CELL_VAR-unset}\" \"${HOME_BEFORE-unset}\""},
	} {
		t.Run(string(tc.lang), func(t *testing.T) {
			t.Parallel()
			k := start(t, interp.Config{Language: tc.lang})
			res, err := k.ExecuteWith(context.Background(), tc.show+"\n"+tc.child, interp.ExecuteOptions{Env: env, Timeout: 30 * time.Second}, nil)
			if err != nil || res.Error != nil {
				t.Fatalf("%v %v %s", err, res.Error, res.Stderr)
			}
			if want := env["AIRLOCK_CELL_VAR"] + "\n2\n"; res.Stdout != want {
				t.Errorf("stdout %q, want %q", res.Stdout, want)
			}
			// The variables are gone after the cell.
			if res := ok(t, k, tc.gone); res.Stdout != "unset unset\n" {
				t.Errorf("after the cell: %q", res.Stdout)
			}
		})
	}
	k := bash(t)
	for _, name := range []string{"", "A=B", "1X", "A-B"} {
		if _, err := k.ExecuteWith(context.Background(), "true", interp.ExecuteOptions{Env: map[string]string{name: "v"}}, nil); err == nil {
			t.Errorf("bash accepted the variable name %q", name)
		}
	}
	if _, err := k.ExecuteWith(context.Background(), "true", interp.ExecuteOptions{Env: map[string]string{"V": "a\x00b"}}, nil); err == nil {
		t.Error("a NUL in a value was accepted")
	}
}

func TestPythonMagics(t *testing.T) {
	t.Parallel()
	k := python(t)
	res := ok(t, k, "%matplotlib inline\n!echo from shell\nfor i in range(2):\n    !echo loop $((1+1))\n%cd /tmp\nx = 5\n%pwd")
	if res.Stdout != "from shell\nloop 2\nloop 2\n/tmp\n" || plain(t, res) != "'/tmp'" {
		t.Errorf("stdout %q, results %v", res.Stdout, res.Results)
	}
	ok(t, k, "%env AIRLOCK_MAGIC=1")
	if res := ok(t, k, "import os\nos.environ['AIRLOCK_MAGIC']"); plain(t, res) != "'1'" {
		t.Errorf("%%env: %v", res.Results)
	}
	wantError(t, run(t, k, "%timeit 1", 0), "NameError")
	// Cells that parse are left alone, and real syntax errors stay so.
	wantError(t, run(t, k, "x = (1,\n!echo no", 0), "SyntaxError")
	if res := ok(t, k, "s = '''\n!not a command\n'''\ns.strip()"); plain(t, res) != "'!not a command'" {
		t.Errorf("string: %v", res.Results)
	}
}
