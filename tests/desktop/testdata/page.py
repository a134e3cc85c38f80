# A page with one text field, served on 127.0.0.1:8000 inside a desktop
# sandbox; every key pressed in the field is POSTed back and appended to
# /tmp/page.log, one per line: the page's own log of keystrokes.
import http.server

PAGE = b"""<!doctype html><html><head><title>airlock-page</title></head>
<body style="margin:0;background:#2a6">
<input id="f" autocomplete="off"
  style="position:absolute;left:100px;top:100px;width:400px;height:60px;font-size:30px;border:0">
<script>
// One request at a time, in the order of the keys.
let chain = Promise.resolve();
document.getElementById('f').addEventListener('keydown', (e) => {
  chain = chain.then(() => fetch('/log', {method: 'POST', body: e.key}));
});
</script></body></html>"""


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)

    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        key = self.rfile.read(min(n, 64)).decode("utf-8", "replace")
        with open("/tmp/page.log", "a") as f:
            f.write(key + "\n")
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


http.server.ThreadingHTTPServer(("127.0.0.1", 8000), Handler).serve_forever()
