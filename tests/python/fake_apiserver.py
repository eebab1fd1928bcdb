"""A stateful fake Kubernetes API server on loopback, for running the real operator binary
without a cluster (none can run on this project's machines). It models what a controller's
correctness depends on (the objects the operator applies and reads back):

* uid, creationTimestamp and one monotonic resourceVersion over all objects;
* writes that change nothing neither bump the resourceVersion nor emit a watch event;
* metadata.generation bumps only when spec changes;
* the status subresource is separate: the main endpoint ignores status, /status only takes it;
* server-side apply (PATCH application/apply-patch+yaml) creates a missing object; merge patch;
* list carries the collection resourceVersion; watch from a resourceVersion streams the events
  after it and ends after timeoutSeconds;
* 404 and 409 Status bodies; equality label selectors;
* delete cascades to objects whose ownerReferences name the deleted uid (synchronously; a real
  cluster's garbage collector is asynchronous);
* a Deployment "controller" that reports every Deployment's replicas as ready, so Ready and
  Available conditions can be exercised;
* field ownership under `spec`, per leaf: an apply without force that would change a field
  another manager owns fails with 409 Conflict (leader election through a Lease relies on it);
  merge and strategic-merge patches take ownership of what they set and drop what they null.

It does not model ownership outside `spec` or removal of fields an apply no longer names,
admission (CEL, defaulting, pruning) or anything
else a real API server does. Test hooks: GET /_fake/stats (requests and changing writes per
method and kind), POST /_fake/reset-stats, POST /_fake/fail {"request": "PATCH Deployment",
"times": N} (the next N such requests answer 500).

usage: fake_apiserver.py PORT_FILE   (binds an ephemeral port on 127.0.0.1 and writes it there)
"""
import copy
import json
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

LOCK = threading.Condition()
OBJECTS = {}  # (group, version, plural, namespace, name) -> object
EVENTS = []  # (rv, (group, version, plural), namespace, type, object)
STATE = {"rv": 100}
STATS = {"requests": {}, "writes": {}}
OWNERS = {}  # object key -> {spec leaf path: field manager}
FAIL = {}  # "METHOD Kind" -> how many more of those requests answer 500

KINDS = {
    ("", "v1", "configmaps"): "ConfigMap",
    ("", "v1", "services"): "Service",
    ("apps", "v1", "deployments"): "Deployment",
    ("policy", "v1", "poddisruptionbudgets"): "PodDisruptionBudget",
    ("amqp.kubemq.io", "v1alpha1", "amqpconnectors"): "AmqpConnector",
    ("coordination.k8s.io", "v1", "leases"): "Lease",
    ("events.k8s.io", "v1", "events"): "Event",
}


def api_version(group, version):
    return version if group == "" else group + "/" + version


def count(table, key):
    STATS[table][key] = STATS[table].get(key, 0) + 1


def comparable(obj):
    o = copy.deepcopy(obj)
    meta = o.get("metadata", {})
    for k in ("resourceVersion", "managedFields", "generation", "creationTimestamp", "uid"):
        meta.pop(k, None)
    return o


def merge(base, patch, delete_nulls):
    if not isinstance(base, dict) or not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(base)
    for k, v in patch.items():
        if v is None and delete_nulls:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v, delete_nulls)
        else:
            out[k] = copy.deepcopy(v)
    return out


def record(res, ns, kind_of_event, obj):
    STATE["rv"] += 1
    obj["metadata"]["resourceVersion"] = str(STATE["rv"])
    EVENTS.append((STATE["rv"], res, ns, kind_of_event, copy.deepcopy(obj)))
    count("writes", "%s %s" % (kind_of_event, KINDS.get(res, res[2])))
    LOCK.notify_all()


def store(res, ns, name, new, old):
    """Stores `new` unless it equals `old`; returns the stored object."""
    if old is not None and comparable(new) == comparable(old):
        return old
    meta = new.setdefault("metadata", {})
    if old is None:
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        meta["generation"] = 1
    else:
        for k in ("uid", "creationTimestamp"):
            meta[k] = old["metadata"][k]
        meta["generation"] = old["metadata"].get("generation", 1) + (
            1 if new.get("spec") != old.get("spec") else 0)
    OBJECTS[res + (ns, name)] = new
    record(res, ns, "ADDED" if old is None else "MODIFIED", new)
    if res == ("apps", "v1", "deployments"):
        deployment_controller(ns, name, new)
    return new


def deployment_controller(ns, name, dep):
    replicas = dep.get("spec", {}).get("replicas", 1)
    status = {"observedGeneration": dep["metadata"]["generation"], "replicas": replicas,
              "readyReplicas": replicas, "updatedReplicas": replicas,
              "availableReplicas": replicas}
    if dep.get("status") != status:
        new = copy.deepcopy(dep)
        new["status"] = status
        OBJECTS[("apps", "v1", "deployments", ns, name)] = new
        record(("apps", "v1", "deployments"), ns, "MODIFIED", new)


def cascade(uid):
    for key, obj in list(OBJECTS.items()):
        refs = obj.get("metadata", {}).get("ownerReferences") or []
        if any(r.get("uid") == uid for r in refs) and key in OBJECTS:
            delete(key)


def delete(key):
    obj = OBJECTS.pop(key)
    OWNERS.pop(key, None)
    record(key[:3], key[3], "DELETED", obj)
    cascade(obj["metadata"]["uid"])
    return obj


def matches(obj, selector):
    if not selector:
        return True
    labels = obj.get("metadata", {}).get("labels") or {}
    for term in selector.split(","):
        k, _, v = term.partition("=")
        if labels.get(k) != v:
            return False
    return True


def leaves(value, prefix=()):
    if isinstance(value, dict) and value:
        for k, v in value.items():
            yield from leaves(v, prefix + (k,))
    else:
        yield prefix, value


def at(obj, path):
    for k in path:
        if not isinstance(obj, dict) or k not in obj:
            return None
        obj = obj[k]
    return obj


def conflicts(key, old, patch, manager):
    owners = OWNERS.get(key, {})
    found = []
    for path, value in leaves(patch.get("spec") or {}):
        owner = owners.get(path)
        if owner and owner != manager and at((old or {}).get("spec") or {}, path) != value:
            found.append(".spec." + ".".join(path) + " (owned by " + owner + ")")
    return found


def take_ownership(key, patch, manager):
    owners = OWNERS.setdefault(key, {})
    for path, value in leaves(patch.get("spec") or {}):
        if value is None:
            owners.pop(path, None)
        elif manager:
            owners[path] = manager


def parse(path):
    """(group, version, plural, namespace or None, name or None, subresource or None)."""
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, version, rest = "", "v1", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    ns = None
    if rest[:1] == ["namespaces"] and len(rest) >= 3:
        ns, rest = rest[1], rest[2:]
    if not rest:
        return None
    return (group, version, rest[0], ns, rest[1] if len(rest) > 1 else None,
            rest[2] if len(rest) > 2 else None)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send_json(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def status(self, code, reason, message):
        self.send_json(code, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                              "status": "Failure", "message": message, "reason": reason,
                              "code": code})

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(n) or b"{}")

    def route(self, method):
        url = urlparse(self.path)
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        if url.path == "/_fake/stats" and method == "GET":
            with LOCK:
                return self.send_json(200, STATS)
        if url.path == "/_fake/fail" and method == "POST":
            spec = self.body()
            with LOCK:
                FAIL[spec["request"]] = int(spec["times"])
                return self.send_json(200, {})
        if url.path == "/_fake/reset-stats" and method == "POST":
            with LOCK:
                STATS["requests"].clear()
                STATS["writes"].clear()
                return self.send_json(200, {})
        p = parse(url.path)
        if p is None or p[:3] not in KINDS:
            return self.status(404, "NotFound", "no such resource: " + url.path)
        group, version, plural, ns, name, sub = p
        res = (group, version, plural)
        request = "%s %s%s" % (method, KINDS[res], "/" + sub if sub else "")
        with LOCK:
            count("requests", request)
            failing = FAIL.get(request, 0) > 0
            if failing:
                FAIL[request] -= 1
        if failing:
            self.body()
            return self.status(500, "InternalError", "injected failure of " + request)
        if method == "GET" and name is None and q.get("watch") in ("true", "1"):
            return self.watch(res, ns, q)
        with LOCK:
            if method == "GET" and name is None:
                items = [o for k, o in sorted(OBJECTS.items())
                         if k[:3] == res and (ns is None or k[3] == ns)
                         and matches(o, q.get("labelSelector"))]
                return self.send_json(200, {"apiVersion": api_version(group, version),
                                            "kind": KINDS[res] + "List",
                                            "metadata": {"resourceVersion": str(STATE["rv"])},
                                            "items": items})
            key = res + (ns, name)
            old = OBJECTS.get(key)
            if method == "GET":
                if old is None:
                    return self.status(404, "NotFound", "%s %r not found" % (plural, name))
                return self.send_json(200, old)
            if method == "DELETE":
                if old is None:
                    return self.status(404, "NotFound", "%s %r not found" % (plural, name))
                return self.send_json(200, delete(key))
            body = self.body()
            body.setdefault("metadata", {})
            body["apiVersion"] = api_version(group, version)
            body["kind"] = KINDS[res]
            if method == "POST":
                name = body["metadata"].get("name")
                key = res + (ns, name)
                if key in OBJECTS:
                    return self.status(409, "AlreadyExists", "%s %r already exists" % (plural, name))
                body["metadata"]["namespace"] = ns
                body.pop("status", None)
                return self.send_json(201, store(res, ns, name, body, None))
            if method == "PATCH":
                ctype = self.headers.get("Content-Type", "")
                apply = "apply-patch" in ctype
                manager = q.get("fieldManager", "")
                if apply and q.get("force") not in ("true", "1") and sub != "status":
                    clash = conflicts(key, old, body, manager)
                    if clash:
                        return self.status(409, "Conflict", "Apply failed with conflicts: " + ", ".join(clash))
                if old is None and not apply:
                    return self.status(404, "NotFound", "%s %r not found" % (plural, name))
                base = old or {"apiVersion": body["apiVersion"], "kind": body["kind"],
                               "metadata": {"name": name, "namespace": ns}}
                if sub == "status":
                    if old is None:
                        return self.status(404, "NotFound", "%s %r not found" % (plural, name))
                    new = copy.deepcopy(old)
                    new["status"] = merge(old.get("status") or {}, body.get("status") or {},
                                          not apply)
                    if apply:
                        new["status"] = body.get("status") or {}
                else:
                    body.pop("status", None)
                    new = merge(base, body, not apply)
                    if old is not None and "status" in old:
                        new["status"] = old["status"]
                new["metadata"]["name"], new["metadata"]["namespace"] = name, ns
                if sub != "status":
                    take_ownership(key, body, manager)
                return self.send_json(200, store(res, ns, name, new, old))
        return self.status(405, "MethodNotAllowed", method)

    def watch(self, res, ns, q):
        since = int(q.get("resourceVersion") or 0)
        deadline = time.time() + min(int(q.get("timeoutSeconds") or 290), 290)
        selector = q.get("labelSelector")
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            while time.time() < deadline:
                with LOCK:
                    due = [e for e in EVENTS if e[0] > since and e[1] == res
                           and (ns is None or e[2] == ns) and matches(e[4], selector)]
                    if not due:
                        LOCK.wait(timeout=min(1.0, max(0.0, deadline - time.time())))
                        continue
                for rv, _, _, typ, obj in due:
                    line = json.dumps({"type": typ, "object": obj}).encode() + b"\n"
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                    since = rv
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass

    def do_GET(self):
        self.route("GET")

    def do_POST(self):
        self.route("POST")

    def do_PATCH(self):
        self.route("PATCH")

    def do_DELETE(self):
        self.route("DELETE")

    def do_PUT(self):
        self.route("PUT")


def main():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    with open(sys.argv[1], "w") as f:
        f.write(str(server.server_address[1]))
    server.serve_forever()


main()
