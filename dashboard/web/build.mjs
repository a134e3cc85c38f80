// Builds the dashboard into ../dist (embedded by package dashboard):
// app.js (src/app.js with xterm.js bundled), app.css (src/app.css and
// xterm.css) and index.html. The output is deterministic: `go test
// ./dashboard` rebuilds into a temporary directory and compares.
import * as esbuild from "esbuild";
import { copyFileSync, mkdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const out = process.argv[2] || join(here, "..", "dist");
mkdirSync(out, { recursive: true });
const common = { bundle: true, minify: true, legalComments: "none", logLevel: "warning", absWorkingDir: here };
await esbuild.build({ ...common, entryPoints: ["src/app.js"], outfile: join(out, "app.js"), format: "iife", target: "es2020" });
await esbuild.build({ ...common, entryPoints: ["src/app.css"], outfile: join(out, "app.css") });
copyFileSync(join(here, "index.html"), join(out, "index.html"));
