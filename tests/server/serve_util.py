"""A `dsinfer serve` process on loopback for the stdlib-only e2e scripts (kv_tier_restart.py,
speculative_e2e.py): start and wait for /ready, JSON and SSE requests, /metrics, stop."""
import atexit, json, signal, socket, subprocess, sys, time, urllib.request


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Server:
    def __init__(self, dsinfer, model, extra, log, threads=2):
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.log = open(log, "ab")
        self.proc = subprocess.Popen([dsinfer, "serve", "--model", model, "--host", "127.0.0.1",
                                      "--port", str(self.port), "--threads", str(threads),
                                      "--served-model-name", "m"] + extra,
                                     stdout=self.log, stderr=self.log)
        atexit.register(self.kill)  # a failed check must not leave a server behind
        for _ in range(600):
            if self.proc.poll() is not None:
                sys.exit("server exited with %d; see %s" % (self.proc.returncode, log))
            try:
                urllib.request.urlopen(self.url + "/ready", timeout=2)
                return
            except Exception:
                time.sleep(0.2)
        sys.exit("server not ready")

    def post(self, path, body):
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            return json.loads(r.read() or b"{}")

    def stream(self, path, body):
        """The SSE events' JSON objects, in order."""
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        events = []
        with urllib.request.urlopen(req, timeout=600) as r:
            for line in r:
                line = line.decode().strip()
                if line.startswith("data: ") and line != "data: [DONE]":
                    events.append(json.loads(line[6:]))
        return events

    def metrics(self):
        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as r:
            return r.read().decode()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=120)
        if rc != 0:
            sys.exit("server exited with %d after SIGTERM" % rc)


def metric(text, name):
    """The value of the sample named exactly `name` (labels included) in a /metrics text."""
    for line in text.splitlines():
        if line.split(" ")[0] == name:
            return float(line.split(" ")[-1])
    sys.exit("metric %s missing" % name)
