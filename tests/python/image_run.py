"""Runs an unpacked image's entrypoint the way a container runtime would (chroot into the
image's root filesystem, its working directory, user, arguments and environment, from the
runtime configuration umoci wrote beside it) inside a private network namespace, and checks it.
Started under `unshare -n` by tests/tests/images.rs; prints PASS.

Usage:
  image_run.py connector BUNDLE FACADE_BINARY
      KubeMQ is played by FACADE_BINARY (the connector serving its embedded store as KubeMQ's
      gRPC API: the real KubeMQ cannot be fetched on this project's machines) at the name
      kubemq.test, which only the image's /etc/hosts knows: the connector in the image must
      resolve it through its nsswitch.conf. Checks /livez, /readyz and a send and receive with
      python-qpid-proton through it; then the image on its embedded store, written as user
      65532 into its working directory, which is the image's volume.
  image_run.py operator BUNDLE VERSION
      The operator's entrypoint with --version prints its name and VERSION."""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

from proton import Message
from proton.utils import BlockingConnection

TIMEOUT = 20


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def container(bundle, extra_args=(), extra_env=None, **popen):
    """The image's process, as its runtime configuration says."""
    spec = json.load(open(os.path.join(bundle, "config.json")))["process"]
    rootfs = os.path.join(bundle, "rootfs")
    env = dict(e.split("=", 1) for e in spec["env"])
    env.update(extra_env or {})
    user = spec["user"]

    def enter():
        os.chroot(rootfs)
        os.chdir(spec["cwd"])
        os.setgroups(user.get("additionalGids", []))
        os.setgid(user["gid"])
        os.setuid(user["uid"])

    return subprocess.Popen(
        spec["args"] + list(extra_args), env=env, preexec_fn=enter, **popen
    )


def wait_port(port, what):
    deadline = time.time() + TIMEOUT
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("%s never listened on %d" % (what, port))


def http_status(path):
    try:
        return urllib.request.urlopen("http://127.0.0.1:9090" + path, timeout=2).status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def wait_ready(proc, log):
    deadline = time.time() + TIMEOUT
    while time.time() < deadline:
        check(proc.poll() is None, "the image's connector exited: %s" % read(log))
        if http_status("/readyz") == 200:
            return
        time.sleep(0.2)
    raise AssertionError("never ready; /readyz %s; log: %s" % (http_status("/readyz"), read(log)))


def read(path):
    with open(path, errors="replace") as f:
        return f.read()


def send_and_receive(queue, bodies):
    c = BlockingConnection("amqp://127.0.0.1:5672", timeout=TIMEOUT, container_id="image-check")
    s = c.create_sender("queues/" + queue)
    for b in bodies:
        s.send(Message(body=b))  # blocks until accepted
    r = c.create_receiver("queues/" + queue, credit=len(bodies))
    got = []
    for _ in bodies:
        m = r.receive(timeout=TIMEOUT)
        got.append(m.body)
        r.accept()
    c.close()
    check(got == bodies, "received %r, sent %r" % (got, bodies))


def stop(proc, log):
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=TIMEOUT)
    check(code == 0, "exit %s after SIGTERM; log: %s" % (code, read(log)))


def connector(bundle, facade_binary):
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    rootfs = os.path.join(bundle, "rootfs")
    check(not os.path.exists(os.path.join(rootfs, "etc/hosts")), "the image brings an /etc/hosts")
    # As Kubernetes and Docker do, the host file is the runtime's, not the image's.
    with open(os.path.join(rootfs, "etc/hosts"), "w") as f:
        f.write("127.0.0.1 localhost\n127.0.0.1 kubemq.test\n")
    work = tempfile.mkdtemp()
    facade_log = os.path.join(work, "facade.log")
    facade = subprocess.Popen(
        [facade_binary],
        cwd=work,
        env={
            "CONNECTORS_AMQP10_PORT": "5700",
            "CONNECTORS_AMQP10_HTTP_ADDRESS": "off",
            "CONNECTORS_AMQP10_SERVE_KUBEMQ_GRPC": "127.0.0.1:50000",
        },
        stdout=open(facade_log, "w"),
        stderr=subprocess.STDOUT,
    )
    try:
        wait_port(50000, "the façade")
        log = os.path.join(work, "image-grpc.log")
        proc = container(
            bundle,
            extra_env={"CONNECTORS_AMQP10_KUBEMQ_ADDRESS": "kubemq.test:50000"},
            stdout=open(log, "w"),
            stderr=subprocess.STDOUT,
        )
        wait_ready(proc, log)
        check(http_status("/livez") == 200, "/livez")
        send_and_receive("image-check", ["through the image %d" % i for i in range(3)])
        check("kubemq.test:50000" in read(log), "the log names the KubeMQ address: " + read(log))
        stop(proc, log)
    finally:
        facade.kill()
        facade.wait()

    # The embedded store: the image's own defaults, its user writing into its volume.
    log = os.path.join(work, "image-embedded.log")
    proc = container(bundle, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    wait_ready(proc, log)
    send_and_receive("image-embedded", ["kept by the image %d" % i for i in range(3)])
    stop(proc, log)
    spec = json.load(open(os.path.join(bundle, "config.json")))["process"]
    data = os.path.join(rootfs, spec["cwd"].lstrip("/"), "data")
    check(os.path.isdir(data) and os.listdir(data), "no store in %s" % data)
    check(os.stat(data).st_uid == 65532, "the store is not the image user's")


def operator(bundle, version):
    proc = container(
        bundle, extra_args=["--version"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    stdout, stderr = proc.communicate(timeout=TIMEOUT)
    check(proc.returncode == 0, "exit %s: %s" % (proc.returncode, stderr))
    want = "kubemq-amqp-operator " + version
    check(stdout.strip() == want, "printed %r, not %r" % (stdout, want))


if __name__ == "__main__":
    kind = sys.argv[1]
    if kind == "connector":
        connector(sys.argv[2], sys.argv[3])
    elif kind == "operator":
        operator(sys.argv[2], sys.argv[3])
    else:
        raise SystemExit("unknown image " + kind)
    print("PASS")
