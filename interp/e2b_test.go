package interp_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/interp"
)

// Notebook habits E2B's code interpreter supports: indented cells, a
// DataFrame's columns as data, ES module imports, TypeScript.

func TestPythonIndentedCellIsDedented(t *testing.T) {
	t.Parallel()
	k := python(t)
	res := ok(t, k, "\n    x = 20\n    if x:\n        print('in', x)\n    s = '''\n    kept\n    '''\n    x + 22")
	if got := plain(t, res); got != "42" || res.Stdout != "in 20\n" {
		t.Fatalf("indented cell: result %q, stdout %q", got, res.Stdout)
	}
	// textwrap.dedent: common indentation only, inside strings too.
	if got := plain(t, ok(t, k, "s")); got != `'\nkept\n'` {
		t.Errorf("string in an indented cell: %s", got)
	}
	// Unequal indentation stays an error.
	wantError(t, run(t, k, "  a = 1\n b = 2", 30*time.Second), "IndentationError")
}

func TestPythonDataFrameData(t *testing.T) {
	t.Parallel()
	needModules(t, "pandas", "numpy")
	k := python(t)
	res := ok(t, k, `import pandas as pd, numpy as np
pd.DataFrame({"n": np.array([1, 2], dtype=np.int64), "f": [0.5, None], "t": pd.to_datetime(["2024-01-01", "2024-01-02 03:04:05"])})`)
	raw := res.Results[0]["e2b/data"]
	var data map[string][]any
	if err := json.Unmarshal([]byte(raw), &data); err != nil {
		t.Fatalf("e2b/data %q: %v", raw, err)
	}
	b, _ := json.Marshal(data)
	if string(b) != `{"f":[0.5,null],"n":[1,2],"t":["2024-01-01T00:00:00","2024-01-02T03:04:05"]}` {
		t.Errorf("e2b/data %s", b)
	}
	// A Series is not a DataFrame: no data.
	if d, ok := ok(t, k, `pd.Series([1, 2])`).Results[0]["e2b/data"]; ok {
		t.Errorf("Series has e2b/data %q", d)
	}
}

func TestJavaScriptESMImports(t *testing.T) {
	t.Parallel()
	k := javascript(t)
	res := ok(t, k, "import fs from 'fs'\nimport { join as j, sep } from 'node:path'\nimport * as os from 'os'\nimport 'node:util'\nj('a', 'b') + sep")
	if got := plain(t, res); got != "'a/b/'" {
		t.Errorf("cell with imports: %s", got)
	}
	if strings.Contains(res.Stderr, "Warning") {
		t.Errorf("stderr %q", res.Stderr)
	}
	// The bindings persist like any top-level declaration.
	if got := plain(t, ok(t, k, "[typeof fs.readFileSync, typeof os.cpus, typeof j].join()")); got != "'function,function,function'" {
		t.Errorf("imports in the next cell: %s", got)
	}
	if got := plain(t, ok(t, k, "export const e = 5\ne + 1")); got != "6" {
		t.Errorf("export const: %s", got)
	}
	wantError(t, run(t, k, "import nothing from 'no-such-module-airlock'", 30*time.Second), "Error")
	wantError(t, run(t, k, "import { from 'fs'", 30*time.Second), "SyntaxError")
}

func TestTypeScriptCells(t *testing.T) {
	t.Parallel()
	k := start(t, interp.Config{Language: interp.TypeScript, KillAfter: 2 * time.Second})
	if k.Language() != interp.TypeScript {
		t.Fatalf("language %s", k.Language())
	}
	ok(t, k, "interface P { x: number }\nconst p: P = { x: 41 }\nimport { join } from 'path'\nenum Color { Red = 'r' }")
	if got := plain(t, ok(t, k, "const add = (a: number, b: number): number => a + b\nadd(p.x, 1) + join('a', Color.Red).length")); got != "45" {
		t.Errorf("typed cell: %s", got)
	}
	e := wantError(t, run(t, k, "const a: number = ", 30*time.Second), "SyntaxError")
	if !strings.Contains(e.Value, "line 1") {
		t.Errorf("syntax error %q does not say where", e.Value)
	}
	// Types are stripped, not checked (as E2B's TypeScript kernel does
	// at run time).
	if got := plain(t, ok(t, k, "const s: number = 'text' as any\ns")); got != "'text'" {
		t.Errorf("unchecked types: %s", got)
	}
}

func TestPythonChartData(t *testing.T) {
	t.Parallel()
	needModules(t, "matplotlib")
	k := python(t)
	res := ok(t, k, `import matplotlib.pyplot as plt
plt.plot([1, 2, 3], [1, 4, 9], label="squares")
plt.plot([1, 2, 3], [1, 2, 3])
plt.title("growth")
plt.xlabel("n")
plt.ylabel("size (MB)")
plt.show()
fig, ax = plt.subplots()
ax.bar(["a", "b", "c"], [3, 1, 2], label="counts")
ax.set_title("bars")
plt.show()`)
	if len(res.Results) != 2 {
		t.Fatalf("%d results, want 2 figures", len(res.Results))
	}
	var line struct {
		Type, Title, XLabel, YLabel, YUnit, XScale string
		Elements                                   []struct {
			Label  string
			Points [][2]float64
		}
	}
	raw := res.Results[0]["e2b/chart"]
	if err := json.Unmarshal([]byte(strings.NewReplacer(`"x_label"`, `"xlabel"`, `"y_label"`, `"ylabel"`, `"y_unit"`, `"yunit"`, `"x_scale"`, `"xscale"`).Replace(raw)), &line); err != nil {
		t.Fatalf("line chart %q: %v", raw, err)
	}
	if line.Type != "line" || line.Title != "growth" || line.XLabel != "n" || line.YLabel != "size (MB)" || line.YUnit != "MB" ||
		line.XScale != "linear" || len(line.Elements) != 2 || line.Elements[0].Label != "squares" ||
		!strings.HasPrefix(line.Elements[1].Label, "Line ") || len(line.Elements[0].Points) != 3 || line.Elements[0].Points[2] != [2]float64{3, 9} {
		t.Errorf("line chart %s", raw)
	}
	var bar struct {
		Type, Title string
		Elements    []struct {
			Label, Group string
			Value        float64
		}
	}
	raw = res.Results[1]["e2b/chart"]
	if err := json.Unmarshal([]byte(raw), &bar); err != nil {
		t.Fatalf("bar chart %q: %v", raw, err)
	}
	b, _ := json.Marshal(bar.Elements)
	if bar.Type != "bar" || bar.Title != "bars" || string(b) != `[{"Label":"a","Group":"counts","Value":3},{"Label":"b","Group":"counts","Value":1},{"Label":"c","Group":"counts","Value":2}]` {
		t.Errorf("bar chart %s", raw)
	}
}

// TestPythonChartKinds: scatter, pie and box-and-whisker figures carry
// E2B's chart data (its code-interpreter suite's charts/*.test.ts): a
// scatter's series of points, a pie's wedges with angle and radius, a box
// plot's quartiles, median, whisker ends and outliers per box.
func TestPythonChartKinds(t *testing.T) {
	t.Parallel()
	needModules(t, "matplotlib")
	k := python(t)
	res := ok(t, k, `import matplotlib.pyplot as plt
plt.scatter([1, 2, 3], [4, 5, 6], label="first")
plt.scatter([0.5], [0.25], label="second")
plt.show()
fig, ax = plt.subplots()
ax.pie([90, 10], labels=["No", "No, in blue"], autopct='%1.1f%%', startangle=90)
plt.title("pie")
plt.show()
fig, ax = plt.subplots()
ax.boxplot([[85, 90, 78, 92, 88], [95, 89, 76, 91, 84, 87]], labels=["A", "B"], patch_artist=True)
plt.show()`)
	if len(res.Results) != 3 {
		t.Fatalf("%d results, want 3 figures", len(res.Results))
	}
	want := []string{
		`{"type":"scatter","elements":[{"label":"first","points":[[1,4],[2,5],[3,6]]},{"label":"second","points":[[0.5,0.25]]}]}`,
		`{"type":"pie","elements":[{"angle":324,"label":"No","radius":1},{"angle":36,"label":"No, in blue","radius":1}]}`,
		`{"type":"box_and_whisker","elements":[{"first_quartile":85,"label":"A","max":92,"median":88,"min":78,"outliers":[],"third_quartile":90},` +
			`{"first_quartile":84.75,"label":"B","max":95,"median":88,"min":84,"outliers":[76],"third_quartile":90.5}]}`,
	}
	for i, w := range want {
		var chart struct {
			Type     string           `json:"type"`
			Elements []map[string]any `json:"elements"`
		}
		raw := res.Results[i]["e2b/chart"]
		if err := json.Unmarshal([]byte(raw), &chart); err != nil {
			t.Fatalf("chart %d %q: %v", i, raw, err)
		}
		if got, _ := json.Marshal(chart); string(got) != w {
			t.Errorf("chart %d:\n got %s\nwant %s", i, got, w)
		}
	}
}
