"""The SDK against a real server: run by python_test.go (go test ./sdk/python),
which starts `airlock serve` and sets $AIRLOCK_URL, $AIRLOCK_API_KEY and
$AIRLOCK_TEST_IMAGE (an image in a registry the server may pull from)."""

from __future__ import annotations

import io
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from airlock import Airlock, AirlockError, Limits, MemorySnapshot  # noqa: E402


class SDKTest(unittest.TestCase):
    al: Airlock

    @classmethod
    def setUpClass(cls) -> None:
        cls.al = Airlock()  # from the environment, as a user's script would

    def sandbox(self, **kw):
        sb = self.al.create(ttl=600, **kw)
        self.addCleanup(sb.kill)
        return sb

    def test_info(self) -> None:
        info = self.al.info()
        self.assertIn("native", info.runtimes)
        self.assertTrue(info.auth)
        self.assertTrue(any(layer.name == "seccomp" and layer.state == "ok" for layer in info.enforced), info.enforced)

    def test_lifecycle(self) -> None:
        sb = self.al.create(ttl=300, metadata={"suite": "py"}, limits=Limits(pids=64))
        try:
            self.assertEqual(sb.state, "running")
            self.assertIsNotNone(sb.expires_at)
            left = (sb.expires_at - sb.created_at).total_seconds()
            self.assertTrue(290 <= left <= 310, left)
            self.assertEqual([s.id for s in self.al.list(metadata={"suite": "py"})], [sb.id])
            self.assertEqual(self.al.get(sb.id).metadata, {"suite": "py"})
            sb.set_ttl(900)
            self.assertGreater((sb.expires_at - sb.created_at).total_seconds(), 800)
        finally:
            sb.kill()
        self.assertEqual(sb.state, "killed")
        self.assertEqual(self.al.list(metadata={"suite": "py"}), [])
        self.assertEqual([s.id for s in self.al.list(metadata={"suite": "py"}, states=["killed"])], [sb.id])
        with self.al.create(ttl=60) as other:
            other_id = other.id
        self.assertEqual(self.al.get(other_id).state, "killed")  # the context manager killed it

    def test_exec(self) -> None:
        sb = self.sandbox()
        r = sb.exec("echo out; echo err >&2; exit 3")
        self.assertEqual((r.stdout, r.stderr, r.exit_code, r.status), ("out\n", "err\n", 3, "nonzero_exit"))
        r = sb.exec(["sh", "-c", 'echo "$A $(pwd)"; cat'], env={"A": "1"}, cwd="/tmp", stdin="fed\n")
        self.assertEqual(r.stdout, "1 /tmp\nfed\n")
        self.assertEqual(sb.exec(["no-such-command"]).exit_code, 127)
        r = sb.exec("sleep 30", timeout=1)
        self.assertEqual(r.status, "timeout")

    def test_exec_stream(self) -> None:
        sb = self.sandbox()
        events = list(sb.exec_stream("echo one; sleep 1; printf '\\377\\376'; echo two >&2; exit 5"))
        types = [e.type for e in events]
        self.assertEqual(types[0], "start")
        self.assertEqual(types[-1], "exit")
        self.assertEqual(events[-1].exit_code, 5)
        stdout = b"".join(e.data for e in events if e.type == "stdout")
        self.assertEqual(stdout, b"one\n\xff\xfe")  # bytes that are not UTF-8 arrive intact
        self.assertEqual(b"".join(e.data for e in events if e.type == "stderr"), b"two\n")
        # Output arrives as it is written: "one" is an event of its own
        # before the exit, not the whole output at the end.
        self.assertEqual(events[1].type, "stdout")
        self.assertEqual(events[1].data, b"one\n")
        missing = list(sb.exec_stream(["no-such-command"]))
        self.assertEqual((missing[-1].type, missing[-1].exit_code, missing[-1].status), ("exit", 127, "not_found"))
        # Leaving the loop early kills the command.
        for ev in sb.exec_stream("echo started; exec sleep 4242"):
            if ev.type == "stdout":
                break
        for _ in range(600):
            if not any(p.running and "4242" in p.argv for p in sb.processes()):
                break
            import time
            time.sleep(0.1)
        else:
            self.fail("the command still runs after the stream was left")

    def test_background_and_attach(self) -> None:
        sb = self.sandbox()
        pid = sb.start("echo a; sleep 1; echo b", tag="bg")
        out = b"".join(e.data for e in sb.attach(pid) if e.type == "stdout")
        self.assertEqual(out, b"a\nb\n")
        procs = {p.pid: p for p in sb.processes()}
        self.assertEqual(procs[pid].exit_code, 0)
        self.assertEqual(procs[pid].tag, "bg")

    def test_files(self) -> None:
        sb = self.sandbox()
        blob = bytes(range(256)) * 1024
        self.assertEqual(sb.files.write("/workspace/bin.dat", blob), len(blob))
        self.assertEqual(sb.files.read("/workspace/bin.dat"), blob)
        self.assertEqual(sb.files.write("streamed.txt", io.BytesIO(b"from a file object"), mode=0o600), 18)
        self.assertEqual(sb.files.read_text("streamed.txt"), "from a file object")
        self.assertEqual(sb.files.stat("streamed.txt").mode & 0o777, 0o600)
        sb.files.mkdir("/workspace/d/e")
        sb.files.write("/workspace/d/e/f.txt", "text")
        names = {f.path: f for f in sb.files.list("/workspace", depth=3)}
        self.assertEqual(names["/workspace/d/e/f.txt"].size, 4)
        self.assertEqual(names["/workspace/d"].type, "dir")
        sb.files.move("/workspace/d/e/f.txt", "/workspace/g.txt")
        self.assertTrue(sb.files.exists("/workspace/g.txt"))
        sb.files.remove("/workspace/d")
        self.assertFalse(sb.files.exists("/workspace/d"))
        with self.assertRaises(AirlockError) as cm:
            sb.files.read("/workspace/d/e/f.txt")
        self.assertEqual(cm.exception.status, 404)
        with self.assertRaises(AirlockError) as cm:
            sb.files.read("/etc/shadow")
        self.assertIn(cm.exception.status, (400, 403))

    def test_code(self) -> None:
        sb = self.sandbox()
        ctx = sb.create_context("python")
        self.assertIn(ctx.id, [c.id for c in sb.contexts()])
        self.assertIsNone(sb.run_code("x = 41", context=ctx).error)
        r = sb.run_code("print('hi'); x + 1", context=ctx)
        self.assertEqual((r.stdout, r.text), ("hi\n", "42"))
        r = sb.run_code("1/0", context=ctx)
        self.assertEqual(r.error.name, "ZeroDivisionError")
        events = list(sb.run_code_stream("import time\nprint('a', flush=True)\ntime.sleep(0.5)\nprint('b')\nx * 2", context=ctx))
        self.assertEqual(events[0].type, "start")
        out = [e.text for e in events if e.type == "stdout"]
        # Streamed: 'a', flushed before the sleep, comes in an event before 'b'.
        self.assertTrue(out[0].startswith("a") and "b" not in out[0], out)
        self.assertEqual("".join(out), "a\nb\n")
        self.assertEqual([e.data.get("text/plain") for e in events if e.type == "result"], ["82"])
        self.assertEqual(events[-1].type, "end")
        r = sb.run_code("import time; time.sleep(30)", context=ctx, timeout=1)
        self.assertEqual(r.error.name, "TimeoutError")
        self.assertEqual(sb.run_code("x", context=ctx).text, "41")  # state kept after the timeout
        sb.restart_context(ctx)
        self.assertEqual(sb.run_code("x", context=ctx).error.name, "NameError")
        self.assertEqual(sb.run_code("echo $((6*7))", language="bash").stdout, "42\n")
        sb.delete_context(ctx)
        self.assertNotIn(ctx.id, [c.id for c in sb.contexts()])

    def test_pause_resume(self) -> None:
        sb = self.sandbox()
        sb.files.write("kept.txt", "kept")
        sb.pause()
        self.assertTrue(sb.paused)
        with self.assertRaises(AirlockError) as cm:
            sb.exec("true")
        self.assertEqual((cm.exception.status, cm.exception.code), (409, "paused"))
        sb.resume()
        self.assertFalse(sb.paused)
        self.assertEqual(sb.exec("cat kept.txt").stdout, "kept")

    def test_memory_snapshot(self) -> None:
        caps = self.al.info().runtime_capabilities.get("gvisor") or {}
        if not caps.get("memory_snapshot"):
            self.skipTest("this server has no gvisor runtime with memory snapshots")
        sb = self.sandbox(runtime="gvisor")
        self.assertIsNone(sb.run_code("secret = 'in memory'").error)
        snap = sb.snapshot()
        self.assertIsInstance(snap, MemorySnapshot)
        self.assertEqual(snap.sandbox_id, sb.id)
        fork = self.sandbox(snapshot=snap.id)
        self.assertEqual(fork.run_code("secret").text, "'in memory'")

    def test_images_volumes_templates(self) -> None:
        ref = os.environ.get("AIRLOCK_TEST_IMAGE")
        if not ref:
            self.skipTest("no $AIRLOCK_TEST_IMAGE")
        img = self.al.pull_image(ref)
        self.assertTrue(img.digest.startswith("sha256:"))
        self.assertIn(img.digest, [i.digest for i in self.al.images()])
        self.assertEqual(self.al.image(ref).digest, img.digest)
        vol = self.al.create_volume("py-vol", 8 << 20)
        self.assertEqual((vol.name, vol.size_bytes), ("py-vol", 8 << 20))
        sb = self.sandbox(image=ref, volumes={"py-vol": "/data"})
        r = sb.exec(["/bin/sh", "-c", "cat /etc/image-marker; echo saved > /data/f; echo changed > /etc/image-marker"])
        self.assertEqual(r.stdout, "from the image\n", r.stderr)
        snap = sb.snapshot_image("py-snap:1")
        self.assertEqual(self.al.image("py-snap:1").digest, snap.digest)
        forked = self.sandbox(image="py-snap:1")
        self.assertEqual(forked.exec(["/bin/sh", "-c", "cat /etc/image-marker"]).stdout, "changed\n")
        sb.kill()
        built = self.al.build_template("py-tmpl:1", f"FROM {ref}\nCOPY app.txt /app/\nRUN cat /app/app.txt > /app/copy.txt\n",
                                       {"app.txt": b"hello\n"})
        self.assertEqual(built.steps, 3)
        t = self.sandbox(image="py-tmpl:1")
        self.assertEqual(t.exec(["/bin/sh", "-c", "cat /app/copy.txt"]).stdout, "hello\n")
        with self.assertRaises(AirlockError) as cm:
            self.al.build_template("py-bad:1", f"FROM {ref}\nRUN exit 9\n")
        self.assertEqual(cm.exception.code, "build_failed")
        self.al.remove_image("py-snap:1")
        self.assertNotIn("py-snap:1", [i.name for i in self.al.images()])
        with self.assertRaises(AirlockError) as cm:
            self.al.image("py-snap:1")
        self.assertEqual(cm.exception.status, 404)
        t.kill()
        forked.kill()
        self.al.delete_volume("py-vol")
        self.assertEqual(self.al.volumes(), [])

    def test_errors(self) -> None:
        with self.assertRaises(AirlockError) as cm:
            Airlock(api_key="al_wrong").list()
        self.assertEqual(cm.exception.status, 401)
        with self.assertRaises(AirlockError) as cm:
            self.al.get("sb-nonexistent")
        self.assertEqual((cm.exception.status, cm.exception.code), (404, "not_found"))
        with self.assertRaises(AirlockError) as cm:
            Airlock(url="http://127.0.0.1:1").info()
        self.assertEqual(cm.exception.status, 0)
        for bad in ("127.0.0.1:7070", "ftp://h", "http://al_key@h:1"):
            with self.assertRaises(ValueError):
                Airlock(url=bad)
        with self.assertRaises(ValueError):
            self.al.create(ttl=-1)


if __name__ == "__main__":
    unittest.main()
